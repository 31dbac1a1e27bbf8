// Runs a parsed template: statements write into output strings, expressions
// become values. Scopes follow Jinja2's: each for-loop iteration, macro
// call, with and set/filter block body has its own scope that reads through
// to the enclosing ones and whose assignments stay inside it; if has none.
// Internal to src/jinja (template.h is the interface).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "jinja/ast.h"
#include "jinja/ctx.h"
#include "jinja/error.h"

namespace kvs::jinja {

struct Scope {
  explicit Scope(std::shared_ptr<Scope> p) : parent(std::move(p)) {}
  const Value* find(const std::string& name) const;  // this scope, then the enclosing ones
  void set(const std::string& name, Value v);
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { Normal, Break, Continue };

class Interp : public Ctx {
 public:
  Interp(const std::string& name, const Limits& limits, std::function<std::tm()> clock);
  ~Interp() override;
  std::string render(const Program& program, const ScopePtr& globals);

  Value filter(const std::string& name, const Value& v, Args args) override;
  bool test(const std::string& name, const Value& v, Args args) override;
  Value call(const Value& fn, Args args) override;
  std::tm now() override { return clock_(); }
  void adopt(const std::shared_ptr<Object>& o) override { adopted_.push_back(o); }

  // Used by the objects that run template code (macros, loops).
  Value call_macro(const MacroDef& def, const ScopePtr& closure, Args args);
  std::string run_loop(const ForStmt& f, const ScopePtr& scope, const Value& iterable, int depth);
  [[noreturn]] void fail(const EvalError& e, int line) const;

 private:
  struct DepthGuard;
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_for(const ForStmt& f, const ScopePtr& scope, std::string& out, const Value& iterable, int depth);
  void exec_call_block(const CallBlockStmt& c, const ScopePtr& scope, std::string& out);
  void assign(const Expr& target, const Value& v, const ScopePtr& scope);
  std::string capture(const Body& body, const ScopePtr& scope);
  void write(std::string& out, std::string_view text);

  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_inner(const Expr& e, const ScopePtr& scope);
  Value eval_compare(const CompareExpr& c, const ScopePtr& scope);
  Value eval_item(const ItemExpr& i, const ScopePtr& scope);
  Value eval_call(const CallExpr& c, const ScopePtr& scope, const Value* extra_caller = nullptr);
  Args eval_args(const CallArgs& a, const ScopePtr& scope);
  Value apply_filter(const FilterExpr& f, const ScopePtr& scope, const Value* input);
  Value lookup(const std::string& name, const ScopePtr& scope) const;

  std::string name_;
  std::function<std::tm()> clock_;
  int depth_ = 0;
  std::vector<std::weak_ptr<Object>> adopted_;
};

}  // namespace kvs::jinja
