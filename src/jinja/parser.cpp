// Statements and the parser's plumbing (Jinja2's parser.py: subparse,
// parse_statement and one parse_* per tag), then the check of filter and
// test names, which Jinja2's compiler makes.
#include <algorithm>

#include "jinja/error.h"
#include "jinja/filters.h"
#include "jinja/parser_impl.h"
#include "jinja/predicates.h"

namespace kvs::jinja {

bool Parser::skip_op(const char* op) {
  if (!is_op(op)) return false;
  advance();
  return true;
}

bool Parser::skip_name(const char* n) {
  if (!is_name(n)) return false;
  advance();
  return true;
}

void Parser::expect_op(const char* op) {
  if (!skip_op(op)) fail("expected token '" + std::string(op) + "', got " + describe(cur()));
}

std::string Parser::expect_name() {
  if (cur().type != Tok::Name) fail("expected token 'name', got " + describe(cur()));
  return advance().text;
}

void Parser::expect_name(const char* n) {
  if (!skip_name(n)) fail("expected token '" + std::string(n) + "', got " + describe(cur()));
}

void Parser::expect(Tok t) {
  if (cur().type != t) {
    const char* what = t == Tok::BlockEnd ? "end of statement block"
                       : t == Tok::VarEnd ? "end of print statement"
                                          : "?";
    fail(std::string("expected token '") + what + "', got " + describe(cur()));
  }
  advance();
}

void Parser::fail(const std::string& message, int line) const {
  throw Error(ErrorKind::Syntax, message, line ? line : cur().line, name_);
}

std::string Parser::describe(const Token& t) const {
  switch (t.type) {
    case Tok::Eof: return "end of template";
    case Tok::BlockEnd: return "'end of statement block'";
    case Tok::VarEnd: return "'end of print statement'";
    case Tok::String: return "string";
    case Tok::Int: return "integer";
    case Tok::Float: return "float";
    default: return "'" + t.text + "'";
  }
}

std::unique_ptr<Program> Parser::program() {
  auto p = std::make_unique<Program>();
  p->body = subparse({});
  return p;
}

Body Parser::subparse(std::initializer_list<const char*> end_tokens) {
  Body body;
  end_stack_.emplace_back(end_tokens.begin(), end_tokens.end());
  while (cur().type != Tok::Eof) {
    const Token& t = cur();
    if (t.type == Tok::Data) {
      body.push_back(std::make_unique<TextStmt>(t.text, t.line));
      advance();
    } else if (t.type == Tok::VarBegin) {
      advance();
      const int line = cur().line;
      body.push_back(std::make_unique<PrintStmt>(tuple(false, true), line));
      expect(Tok::VarEnd);
    } else if (t.type == Tok::BlockBegin) {
      advance();
      for (const char* e : end_tokens)
        if (is_name(e)) {
          end_stack_.pop_back();
          return body;
        }
      body.push_back(statement());
      expect(Tok::BlockEnd);
    } else {
      fail("internal parsing error: unexpected " + describe(t));
    }
  }
  end_stack_.pop_back();
  return body;
}

Body Parser::statements(std::initializer_list<const char*> end_tokens, bool drop_needle) {
  skip_op(":");
  expect(Tok::BlockEnd);
  Body b = subparse(end_tokens);
  if (cur().type == Tok::Eof) {
    std::string looking;
    for (const char* e : end_tokens) looking += std::string(looking.empty() ? "" : " or ") + "'" + e + "'";
    fail("Unexpected end of template. Jinja was looking for the following tags: " + looking +
         ". The innermost block that needs to be closed is '" + tag_stack_.back() + "'.");
  }
  if (drop_needle) advance();
  return b;
}

StmtPtr Parser::statement() {
  const Token& t = cur();
  if (t.type != Tok::Name) fail("tag name expected", t.line);
  const std::string tag = t.text;
  DepthGuard g(*this, t.line);
  tag_stack_.push_back(tag);
  StmtPtr s;
  if (tag == "for")
    s = parse_for();
  else if (tag == "if")
    s = parse_if();
  else if (tag == "set")
    s = parse_set();
  else if (tag == "macro")
    s = parse_macro();
  else if (tag == "call")
    s = parse_call_block();
  else if (tag == "filter")
    s = parse_filter_block();
  else if (tag == "with")
    s = parse_with();
  else if (tag == "print") {
    const int line = advance().line;
    s = std::make_unique<PrintStmt>(tuple(false, true), line);
  } else if (tag == "break" || tag == "continue") {
    const int line = advance().line;
    if (loop_depth_ == 0) fail("'" + tag + "' outside of a loop", line);
    s = std::make_unique<LoopCtlStmt>(tag == "break", line);
  } else if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" || tag == "block" ||
             tag == "autoescape") {
    s = parse_unsupported(tag);
  } else {
    tag_stack_.pop_back();
    std::string msg = "Encountered unknown tag '" + tag + "'.";
    for (auto it = end_stack_.rbegin(); it != end_stack_.rend(); ++it)
      if (!it->empty()) {
        const bool nesting = std::any_of(end_stack_.begin(), end_stack_.end(),
                                         [&](const auto& v) { return std::find(v.begin(), v.end(), tag) != v.end(); });
        std::string looking;
        for (const auto& e : *it) looking += (looking.empty() ? "'" : " or '") + e + "'";
        msg += nesting
                   ? " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " +
                         looking + "."
                   : " Jinja was looking for the following tags: " + looking + ".";
        break;
      }
    if (!tag_stack_.empty()) msg += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
    fail(msg, t.line);
  }
  tag_stack_.pop_back();
  return s;
}

StmtPtr Parser::parse_for() {
  auto f = std::make_unique<ForStmt>(advance().line);
  f->target = assign_target(true, false, {"in"});
  expect_name("in");
  f->iter = tuple(false, false, {"recursive"});
  if (skip_name("if")) f->filter = expression();
  f->recursive = skip_name("recursive");
  ++loop_depth_;
  f->body = statements({"endfor", "else"}, false);
  --loop_depth_;
  if (advance().text != "endfor") f->otherwise = statements({"endfor"}, true);
  return f;
}

StmtPtr Parser::parse_if() {
  auto s = std::make_unique<IfStmt>(advance().line);
  while (true) {
    ExprPtr test = tuple(false, false);
    Body body = statements({"elif", "else", "endif"}, false);
    s->branches.emplace_back(std::move(test), std::move(body));
    const std::string next = advance().text;
    if (next == "elif") continue;
    if (next == "else") s->otherwise = statements({"endif"}, true);
    break;
  }
  return s;
}

StmtPtr Parser::parse_set() {
  const int line = advance().line;
  ExprPtr target = assign_target(true, false, {}, true);
  if (skip_op("=")) {
    auto s = std::make_unique<SetStmt>(line);
    s->target = std::move(target);
    s->value = tuple();
    return s;
  }
  auto s = std::make_unique<SetBlockStmt>(line);
  s->target = std::move(target);
  if (is_op("|")) s->filter = filter_chain(nullptr, false);
  s->body = statements({"endset"}, true);
  return s;
}

void Parser::signature(MacroDef& def) {
  expect_op("(");
  while (!is_op(")")) {
    if (!def.params.empty()) expect_op(",");
    ExprPtr arg = assign_target(true, true);
    def.params.push_back(static_cast<NameExpr&>(*arg).name);
    if (skip_op("="))
      def.defaults.push_back(expression());
    else if (!def.defaults.empty())
      fail("non-default argument follows default argument");
  }
  expect_op(")");
}

namespace {

// Whether `body` reads `name` (a macro's caller / varargs / kwargs), not
// counting nested macros, which have their own.
bool reads_name(const Expr* e, const std::string& name);

bool reads_args(const CallArgs& a, const std::string& n) {
  for (const auto& x : a.pos)
    if (reads_name(x.get(), n)) return true;
  for (const auto& [k, x] : a.kw)
    if (reads_name(x.get(), n)) return true;
  return reads_name(a.star.get(), n) || reads_name(a.star_star.get(), n);
}

bool reads_name(const Expr* e, const std::string& n) {
  if (!e) return false;
  switch (e->kind) {
    case Expr::Kind::Name: return static_cast<const NameExpr*>(e)->name == n;
    case Expr::Kind::List:
      for (const auto& x : static_cast<const ListExpr*>(e)->items)
        if (reads_name(x.get(), n)) return true;
      return false;
    case Expr::Kind::Dict:
      for (const auto& [k, v] : static_cast<const DictExpr*>(e)->items)
        if (reads_name(k.get(), n) || reads_name(v.get(), n)) return true;
      return false;
    case Expr::Kind::Unary: return reads_name(static_cast<const UnaryExpr*>(e)->operand.get(), n);
    case Expr::Kind::Binary:
    case Expr::Kind::And:
    case Expr::Kind::Or: {
      auto* b = static_cast<const BinaryExpr*>(e);
      return reads_name(b->left.get(), n) || reads_name(b->right.get(), n);
    }
    case Expr::Kind::Concat:
      for (const auto& x : static_cast<const ConcatExpr*>(e)->parts)
        if (reads_name(x.get(), n)) return true;
      return false;
    case Expr::Kind::Compare: {
      auto* c = static_cast<const CompareExpr*>(e);
      if (reads_name(c->first.get(), n)) return true;
      for (const auto& [op, x] : c->rest)
        if (reads_name(x.get(), n)) return true;
      return false;
    }
    case Expr::Kind::Cond: {
      auto* c = static_cast<const CondExpr*>(e);
      return reads_name(c->test.get(), n) || reads_name(c->then.get(), n) || reads_name(c->otherwise.get(), n);
    }
    case Expr::Kind::Attr: return reads_name(static_cast<const AttrExpr*>(e)->obj.get(), n);
    case Expr::Kind::Item: {
      auto* i = static_cast<const ItemExpr*>(e);
      return reads_name(i->obj.get(), n) || reads_name(i->key.get(), n);
    }
    case Expr::Kind::Slice: {
      auto* s = static_cast<const SliceExpr*>(e);
      return reads_name(s->start.get(), n) || reads_name(s->stop.get(), n) || reads_name(s->step.get(), n);
    }
    case Expr::Kind::Call: {
      auto* c = static_cast<const CallExpr*>(e);
      return reads_name(c->fn.get(), n) || reads_args(c->args, n);
    }
    case Expr::Kind::Filter: {
      auto* f = static_cast<const FilterExpr*>(e);
      return reads_name(f->operand.get(), n) || reads_args(f->args, n);
    }
    case Expr::Kind::Test: {
      auto* t = static_cast<const TestExpr*>(e);
      return reads_name(t->operand.get(), n) || reads_args(t->args, n);
    }
    default: return false;
  }
}

bool body_reads(const Body& body, const std::string& n);

bool stmt_reads(const Stmt& s, const std::string& n) {
  switch (s.kind) {
    case Stmt::Kind::Print: return reads_name(static_cast<const PrintStmt&>(s).expr.get(), n);
    case Stmt::Kind::If: {
      auto& i = static_cast<const IfStmt&>(s);
      for (const auto& [t, b] : i.branches)
        if (reads_name(t.get(), n) || body_reads(b, n)) return true;
      return body_reads(i.otherwise, n);
    }
    case Stmt::Kind::For: {
      auto& f = static_cast<const ForStmt&>(s);
      return reads_name(f.iter.get(), n) || reads_name(f.filter.get(), n) || body_reads(f.body, n) ||
             body_reads(f.otherwise, n);
    }
    case Stmt::Kind::Set: return reads_name(static_cast<const SetStmt&>(s).value.get(), n);
    case Stmt::Kind::SetBlock: {
      auto& b = static_cast<const SetBlockStmt&>(s);
      return reads_name(b.filter.get(), n) || body_reads(b.body, n);
    }
    case Stmt::Kind::CallBlock: {
      auto& c = static_cast<const CallBlockStmt&>(s);
      return reads_name(c.call.get(), n) || body_reads(c.caller->body, n);
    }
    case Stmt::Kind::FilterBlock: {
      auto& f = static_cast<const FilterBlockStmt&>(s);
      return reads_name(f.filter.get(), n) || body_reads(f.body, n);
    }
    case Stmt::Kind::With: {
      auto& w = static_cast<const WithStmt&>(s);
      for (const auto& [t, v] : w.assigns)
        if (reads_name(v.get(), n)) return true;
      return body_reads(w.body, n);
    }
    default: return false;
  }
}

bool body_reads(const Body& body, const std::string& n) {
  return std::any_of(body.begin(), body.end(), [&](const StmtPtr& s) { return stmt_reads(*s, n); });
}

void note_specials(MacroDef& def) {
  def.uses_caller = body_reads(def.body, "caller");
  def.uses_varargs = body_reads(def.body, "varargs");
  def.uses_kwargs = body_reads(def.body, "kwargs");
}

}  // namespace

StmtPtr Parser::parse_macro() {
  auto m = std::make_unique<MacroStmt>(advance().line);
  m->def = std::make_unique<MacroDef>();
  m->def->line = m->line;
  ExprPtr name = assign_target(true, true);
  m->def->name = static_cast<NameExpr&>(*name).name;
  signature(*m->def);
  const int saved = loop_depth_;
  loop_depth_ = 0;
  m->def->body = statements({"endmacro"}, true);
  loop_depth_ = saved;
  note_specials(*m->def);
  return m;
}

StmtPtr Parser::parse_call_block() {
  auto c = std::make_unique<CallBlockStmt>(advance().line);
  c->caller = std::make_unique<MacroDef>();
  c->caller->name = "caller";
  c->caller->line = c->line;
  if (is_op("(")) signature(*c->caller);
  c->call = expression();
  if (c->call->kind != Expr::Kind::Call) fail("expected call", c->line);
  const int saved = loop_depth_;
  loop_depth_ = 0;
  c->caller->body = statements({"endcall"}, true);
  loop_depth_ = saved;
  note_specials(*c->caller);
  return c;
}

StmtPtr Parser::parse_filter_block() {
  auto f = std::make_unique<FilterBlockStmt>(advance().line);
  f->filter = filter_chain(nullptr, true);
  f->body = statements({"endfilter"}, true);
  return f;
}

StmtPtr Parser::parse_with() {
  auto w = std::make_unique<WithStmt>(advance().line);
  while (cur().type != Tok::BlockEnd) {
    if (!w->assigns.empty()) expect_op(",");
    ExprPtr target = assign_target();
    expect_op("=");
    w->assigns.emplace_back(std::move(target), expression());
  }
  w->body = statements({"endwith"}, true);
  return w;
}

StmtPtr Parser::parse_unsupported(const std::string& tag) {
  // Parsed far enough to skip; rendering it fails as Jinja2 does without a
  // template loader. Blocks and autoescape scopes are not implemented.
  const int line = advance().line;
  if (tag == "block" || tag == "autoescape") fail("the '" + tag + "' tag is not supported by this engine", line);
  while (cur().type != Tok::BlockEnd && cur().type != Tok::Eof) advance();
  return std::make_unique<UnsupportedStmt>(
      "TypeError: no loader for this environment specified ('" + tag + "' needs other templates)", line);
}

namespace {

// Jinja2's compiler checks filter and test names, except in the frame of an
// if statement or an inline if ("soft" frames), where a missing one fails
// only when evaluated.
class NameCheck {
 public:
  explicit NameCheck(const std::string& name) : name_(name) {}
  void body(const Body& b, bool soft) {
    for (const auto& s : b) stmt(*s, soft);
  }

 private:
  void args(const CallArgs& a, bool soft) {
    for (const auto& x : a.pos) expr(x.get(), soft);
    for (const auto& [k, x] : a.kw) expr(x.get(), soft);
    expr(a.star.get(), soft);
    expr(a.star_star.get(), soft);
  }
  void expr(const Expr* e, bool soft);
  void stmt(const Stmt& s, bool soft);
  const std::string& name_;
};

void NameCheck::expr(const Expr* e, bool soft) {
  if (!e) return;
  switch (e->kind) {
    case Expr::Kind::List:
      for (const auto& x : static_cast<const ListExpr*>(e)->items) expr(x.get(), soft);
      break;
    case Expr::Kind::Dict:
      for (const auto& [k, v] : static_cast<const DictExpr*>(e)->items) expr(k.get(), soft), expr(v.get(), soft);
      break;
    case Expr::Kind::Unary: expr(static_cast<const UnaryExpr*>(e)->operand.get(), soft); break;
    case Expr::Kind::Binary:
    case Expr::Kind::And:
    case Expr::Kind::Or:
      expr(static_cast<const BinaryExpr*>(e)->left.get(), soft);
      expr(static_cast<const BinaryExpr*>(e)->right.get(), soft);
      break;
    case Expr::Kind::Concat:
      for (const auto& x : static_cast<const ConcatExpr*>(e)->parts) expr(x.get(), soft);
      break;
    case Expr::Kind::Compare:
      expr(static_cast<const CompareExpr*>(e)->first.get(), soft);
      for (const auto& [op, x] : static_cast<const CompareExpr*>(e)->rest) expr(x.get(), soft);
      break;
    case Expr::Kind::Cond: {
      auto* c = static_cast<const CondExpr*>(e);
      expr(c->test.get(), true), expr(c->then.get(), true), expr(c->otherwise.get(), true);
      break;
    }
    case Expr::Kind::Attr: expr(static_cast<const AttrExpr*>(e)->obj.get(), soft); break;
    case Expr::Kind::Item:
      expr(static_cast<const ItemExpr*>(e)->obj.get(), soft);
      expr(static_cast<const ItemExpr*>(e)->key.get(), soft);
      break;
    case Expr::Kind::Slice: {
      auto* s = static_cast<const SliceExpr*>(e);
      expr(s->start.get(), soft), expr(s->stop.get(), soft), expr(s->step.get(), soft);
      break;
    }
    case Expr::Kind::Call:
      expr(static_cast<const CallExpr*>(e)->fn.get(), soft);
      args(static_cast<const CallExpr*>(e)->args, soft);
      break;
    case Expr::Kind::Filter: {
      auto* f = static_cast<const FilterExpr*>(e);
      if (!soft && !has_filter(f->name))
        throw Error(ErrorKind::Syntax, "No filter named '" + f->name + "'.", e->line, name_);
      expr(f->operand.get(), soft);
      args(f->args, soft);
      break;
    }
    case Expr::Kind::Test: {
      auto* t = static_cast<const TestExpr*>(e);
      if (!soft && !has_test(t->name))
        throw Error(ErrorKind::Syntax, "No test named '" + t->name + "'.", e->line, name_);
      expr(t->operand.get(), soft);
      args(t->args, soft);
      break;
    }
    default: break;
  }
}

void NameCheck::stmt(const Stmt& s, bool soft) {
  switch (s.kind) {
    case Stmt::Kind::Print: expr(static_cast<const PrintStmt&>(s).expr.get(), soft); break;
    case Stmt::Kind::If: {
      auto& i = static_cast<const IfStmt&>(s);
      for (const auto& [t, b] : i.branches) expr(t.get(), true), body(b, true);
      body(i.otherwise, true);
      break;
    }
    case Stmt::Kind::For: {
      auto& f = static_cast<const ForStmt&>(s);
      expr(f.iter.get(), soft);
      expr(f.filter.get(), false);
      body(f.body, false);
      body(f.otherwise, false);
      break;
    }
    case Stmt::Kind::Set: expr(static_cast<const SetStmt&>(s).value.get(), soft); break;
    case Stmt::Kind::SetBlock:
      expr(static_cast<const SetBlockStmt&>(s).filter.get(), false);
      body(static_cast<const SetBlockStmt&>(s).body, false);
      break;
    case Stmt::Kind::Macro: {
      auto& m = *static_cast<const MacroStmt&>(s).def;
      for (const auto& d : m.defaults) expr(d.get(), false);
      body(m.body, false);
      break;
    }
    case Stmt::Kind::CallBlock: {
      auto& c = static_cast<const CallBlockStmt&>(s);
      expr(c.call.get(), soft);
      for (const auto& d : c.caller->defaults) expr(d.get(), false);
      body(c.caller->body, false);
      break;
    }
    case Stmt::Kind::FilterBlock:
      expr(static_cast<const FilterBlockStmt&>(s).filter.get(), false);
      body(static_cast<const FilterBlockStmt&>(s).body, false);
      break;
    case Stmt::Kind::With:
      for (const auto& [t, v] : static_cast<const WithStmt&>(s).assigns) expr(v.get(), soft);
      body(static_cast<const WithStmt&>(s).body, false);
      break;
    default: break;
  }
}

}  // namespace

std::unique_ptr<Program> parse(std::vector<Token> tokens, const std::string& name, const ParseLimits& limits) {
  Parser p(std::move(tokens), name, limits);
  std::unique_ptr<Program> prog = p.program();
  NameCheck(name).body(prog->body, false);
  return prog;
}

}  // namespace kvs::jinja
