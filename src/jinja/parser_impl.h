// The parser's state, shared by its statement half (parser.cpp) and its
// expression half (parser_expr.cpp). Internal to src/jinja.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"

namespace kvs::jinja {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name, const ParseLimits& limits)
      : t_(std::move(tokens)), name_(name), limits_(limits) {}
  std::unique_ptr<Program> program();

  // Expressions (parser_expr.cpp).
  ExprPtr expression(bool with_condexpr = true);
  ExprPtr tuple(bool simplified = false, bool with_condexpr = true, std::initializer_list<const char*> extra_end = {},
                bool explicit_parens = false, bool with_namespace = false);
  ExprPtr assign_target(bool with_tuple = true, bool name_only = false,
                        std::initializer_list<const char*> extra_end = {}, bool with_namespace = false);
  ExprPtr filter_chain(ExprPtr node, bool start_inline);
  CallArgs call_args();

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& advance() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op);
  bool skip_name(const char* n);
  void expect_op(const char* op);
  std::string expect_name();
  void expect_name(const char* n);
  void expect(Tok t);
  [[noreturn]] void fail(const std::string& message, int line = 0) const;
  std::string describe(const Token& t) const;
  // One more level of a left-deep chain (a + b + c, x.y.z, v|f|g): the tree
  // is as deep as the chain is long. `extra` counts the levels to give back.
  void deepen(int& extra, int line);

  // Statements (parser.cpp).
  Body subparse(std::initializer_list<const char*> end_tokens);
  Body statements(std::initializer_list<const char*> end_tokens, bool drop_needle);
  StmtPtr statement();
  StmtPtr parse_for();
  StmtPtr parse_if();
  StmtPtr parse_set();
  StmtPtr parse_macro();
  StmtPtr parse_call_block();
  StmtPtr parse_filter_block();
  StmtPtr parse_with();
  StmtPtr parse_unsupported(const std::string& tag);
  void signature(MacroDef& def);

  // Expression levels (parser_expr.cpp).
  ExprPtr condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr compare();
  ExprPtr math1();
  ExprPtr concat();
  ExprPtr math2();
  ExprPtr pow();
  ExprPtr unary(bool with_filter = true);
  ExprPtr primary(bool with_namespace = false);
  ExprPtr postfix(ExprPtr node);
  ExprPtr filter_expr(ExprPtr node);
  ExprPtr subscript(ExprPtr node);
  ExprPtr subscribed();
  ExprPtr call(ExprPtr node);
  ExprPtr test(ExprPtr node);
  ExprPtr list_literal();
  ExprPtr dict_literal();
  bool tuple_end(std::initializer_list<const char*> extra_end) const;

  std::vector<Token> t_;
  size_t i_ = 0;
  const std::string& name_;
  ParseLimits limits_;
  int depth_ = 0;
  int loop_depth_ = 0;  // break / continue need an enclosing for loop
  std::vector<std::string> tag_stack_;
  std::vector<std::vector<std::string>> end_stack_;

  friend struct DepthGuard;
};

// Counts one level of nesting for the parser's limit while it lives.
struct DepthGuard {
  DepthGuard(Parser& p, int line);
  ~DepthGuard() { --p_.depth_; }
  Parser& p_;
};

}  // namespace kvs::jinja
