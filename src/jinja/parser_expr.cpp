// Expressions, one function per Jinja2 precedence level (parser.py):
// condexpr > or > and > not > compare > + - > ~ > * / // % > ** > unary
// (then postfix . [] (), then filters | and tests `is`).
#include <cstring>

#include "jinja/parser_impl.h"

namespace kvs::jinja {

DepthGuard::DepthGuard(Parser& p, int line) : p_(p) {
  if (++p_.depth_ > p_.limits_.max_nesting)
    p_.fail("the template nests more than " + std::to_string(p_.limits_.max_nesting) + " levels deep", line);
}

void Parser::deepen(int& extra, int line) {
  ++extra;
  if (++depth_ > limits_.max_nesting)
    fail("the template nests more than " + std::to_string(limits_.max_nesting) + " levels deep", line);
}

// Gives back the levels a chain took when the chain's parse ends.
struct ChainDepth {
  ChainDepth(int& depth) : depth_(depth) {}
  ~ChainDepth() { depth_ -= extra; }
  int& depth_;
  int extra = 0;
};

ExprPtr Parser::expression(bool with_condexpr) { return with_condexpr ? condexpr() : parse_or(); }

ExprPtr Parser::condexpr() {
  int line = cur().line;
  ExprPtr expr1 = parse_or();
  while (skip_name("if")) {
    auto c = std::make_unique<CondExpr>(line);
    c->then = std::move(expr1);
    c->test = parse_or();
    if (skip_name("else")) c->otherwise = condexpr();
    expr1 = std::move(c);
    line = cur().line;
  }
  return expr1;
}

ExprPtr Parser::parse_or() {
  int line = cur().line;
  ExprPtr left = parse_and();
  ChainDepth chain(depth_);
  while (skip_name("or")) {
    deepen(chain.extra, cur().line);
    left = std::make_unique<BinaryExpr>(Expr::Kind::Or, BinOp::Add, std::move(left), parse_and(), line);
    line = cur().line;
  }
  return left;
}

ExprPtr Parser::parse_and() {
  int line = cur().line;
  ExprPtr left = parse_not();
  ChainDepth chain(depth_);
  while (skip_name("and")) {
    deepen(chain.extra, cur().line);
    left = std::make_unique<BinaryExpr>(Expr::Kind::And, BinOp::Add, std::move(left), parse_not(), line);
    line = cur().line;
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    const int line = advance().line;
    DepthGuard g(*this, line);
    return std::make_unique<UnaryExpr>(UnaryExpr::Op::Not, parse_not(), line);
  }
  return compare();
}

ExprPtr Parser::compare() {
  const int line = cur().line;
  ExprPtr expr = math1();
  auto c = std::make_unique<CompareExpr>(line);
  while (true) {
    static const std::pair<const char*, CmpOp> kOps[] = {{"==", CmpOp::Eq}, {"!=", CmpOp::Ne}, {"<", CmpOp::Lt},
                                                         {"<=", CmpOp::Le}, {">", CmpOp::Gt},  {">=", CmpOp::Ge}};
    bool matched = false;
    for (const auto& [sym, op] : kOps)
      if (is_op(sym)) {
        advance();
        c->rest.emplace_back(op, math1());
        matched = true;
        break;
      }
    if (matched) continue;
    if (skip_name("in")) {
      c->rest.emplace_back(CmpOp::In, math1());
    } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
      advance();
      advance();
      c->rest.emplace_back(CmpOp::NotIn, math1());
    } else {
      break;
    }
  }
  if (c->rest.empty()) return expr;
  c->first = std::move(expr);
  return c;
}

ExprPtr Parser::math1() {
  int line = cur().line;
  ExprPtr left = concat();
  ChainDepth chain(depth_);
  while (is_op("+") || is_op("-")) {
    deepen(chain.extra, cur().line);
    const BinOp op = advance().text == "+" ? BinOp::Add : BinOp::Sub;
    left = std::make_unique<BinaryExpr>(Expr::Kind::Binary, op, std::move(left), concat(), line);
    line = cur().line;
  }
  return left;
}

ExprPtr Parser::concat() {
  const int line = cur().line;
  ExprPtr first = math2();
  if (!is_op("~")) return first;
  auto c = std::make_unique<ConcatExpr>(line);
  c->parts.push_back(std::move(first));
  while (skip_op("~")) c->parts.push_back(math2());
  return c;
}

ExprPtr Parser::math2() {
  int line = cur().line;
  ExprPtr left = pow();
  ChainDepth chain(depth_);
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    deepen(chain.extra, cur().line);
    const std::string sym = advance().text;
    const BinOp op = sym == "*" ? BinOp::Mul : sym == "/" ? BinOp::Div : sym == "//" ? BinOp::FloorDiv : BinOp::Mod;
    left = std::make_unique<BinaryExpr>(Expr::Kind::Binary, op, std::move(left), pow(), line);
    line = cur().line;
  }
  return left;
}

ExprPtr Parser::pow() {
  int line = cur().line;
  ExprPtr left = unary();
  ChainDepth chain(depth_);
  while (skip_op("**")) {
    deepen(chain.extra, cur().line);
    left = std::make_unique<BinaryExpr>(Expr::Kind::Binary, BinOp::Pow, std::move(left), unary(), line);
    line = cur().line;
  }
  return left;
}

ExprPtr Parser::unary(bool with_filter) {
  const int line = cur().line;
  DepthGuard g(*this, line);
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    const bool neg = advance().text == "-";
    node = std::make_unique<UnaryExpr>(neg ? UnaryExpr::Op::Neg : UnaryExpr::Op::Pos, unary(false), line);
  } else {
    node = primary();
  }
  node = postfix(std::move(node));
  if (with_filter) node = filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::primary(bool with_namespace) {
  const Token& t = cur();
  const int line = t.line;
  if (t.type == Tok::Name) {
    const std::string n = advance().text;
    if (n == "true" || n == "True") return std::make_unique<ConstExpr>(Value(true), line);
    if (n == "false" || n == "False") return std::make_unique<ConstExpr>(Value(false), line);
    if (n == "none" || n == "None") return std::make_unique<ConstExpr>(Value::none(), line);
    if (with_namespace && is_op(".")) {
      advance();
      return std::make_unique<NsRefExpr>(n, expect_name(), line);
    }
    return std::make_unique<NameExpr>(n, line);
  }
  if (t.type == Tok::String) {
    std::string s = advance().text;
    while (cur().type == Tok::String) s += advance().text;  // adjacent literals join
    return std::make_unique<ConstExpr>(Value(std::move(s)), line);
  }
  if (t.type == Tok::Int) return std::make_unique<ConstExpr>(Value(advance().i), line);
  if (t.type == Tok::Float) return std::make_unique<ConstExpr>(Value(advance().f), line);
  if (is_op("(")) {
    advance();
    ExprPtr e = tuple(false, true, {}, true);
    expect_op(")");
    return e;
  }
  if (is_op("[")) return list_literal();
  if (is_op("{")) return dict_literal();
  fail("unexpected " + describe(t), line);
}

bool Parser::tuple_end(std::initializer_list<const char*> extra_end) const {
  if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")")) return true;
  for (const char* n : extra_end)
    if (is_name(n)) return true;
  return false;
}

ExprPtr Parser::tuple(bool simplified, bool with_condexpr, std::initializer_list<const char*> extra_end,
                      bool explicit_parens, bool with_namespace) {
  const int line = cur().line;
  std::vector<ExprPtr> args;
  bool is_tuple = false;
  while (true) {
    if (!args.empty()) expect_op(",");
    if (tuple_end(extra_end)) break;
    args.push_back(simplified ? primary(with_namespace) : expression(with_condexpr));
    if (is_op(","))
      is_tuple = true;
    else
      break;
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parens) fail("Expected an expression, got " + describe(cur()));
  }
  auto t = std::make_unique<ListExpr>(true, line);
  t->items = std::move(args);
  return t;
}

ExprPtr Parser::list_literal() {
  const int line = cur().line;
  expect_op("[");
  auto l = std::make_unique<ListExpr>(false, line);
  while (!is_op("]")) {
    if (!l->items.empty()) expect_op(",");
    if (is_op("]")) break;
    l->items.push_back(expression());
  }
  expect_op("]");
  return l;
}

ExprPtr Parser::dict_literal() {
  const int line = cur().line;
  expect_op("{");
  auto d = std::make_unique<DictExpr>(line);
  while (!is_op("}")) {
    if (!d->items.empty()) expect_op(",");
    if (is_op("}")) break;
    ExprPtr k = expression();
    expect_op(":");
    d->items.emplace_back(std::move(k), expression());
  }
  expect_op("}");
  return d;
}

ExprPtr Parser::postfix(ExprPtr node) {
  ChainDepth chain(depth_);
  while (true) {
    deepen(chain.extra, cur().line);
    if (is_op(".") || is_op("["))
      node = subscript(std::move(node));
    else if (is_op("("))
      node = call(std::move(node));
    else
      return node;
  }
}

ExprPtr Parser::filter_expr(ExprPtr node) {
  ChainDepth chain(depth_);
  while (true) {
    deepen(chain.extra, cur().line);
    if (is_op("|"))
      node = filter_chain(std::move(node), false);
    else if (is_name("is"))
      node = test(std::move(node));
    else if (is_op("("))
      node = call(std::move(node));
    else
      return node;
  }
}

ExprPtr Parser::subscript(ExprPtr node) {
  const Token t = advance();
  if (t.text == ".") {
    const Token& a = cur();
    if (a.type == Tok::Name) return std::make_unique<AttrExpr>(std::move(node), advance().text, t.line);
    if (a.type != Tok::Int) fail("expected name or number", a.line);
    auto key = std::make_unique<ConstExpr>(Value(advance().i), a.line);
    return std::make_unique<ItemExpr>(std::move(node), std::move(key), t.line);
  }
  std::vector<ExprPtr> args;
  while (!is_op("]")) {
    if (!args.empty()) expect_op(",");
    args.push_back(subscribed());
  }
  expect_op("]");
  ExprPtr key;
  if (args.size() == 1) {
    key = std::move(args[0]);
  } else {
    auto tup = std::make_unique<ListExpr>(true, t.line);
    tup->items = std::move(args);
    key = std::move(tup);
  }
  return std::make_unique<ItemExpr>(std::move(node), std::move(key), t.line);
}

ExprPtr Parser::subscribed() {
  const int line = cur().line;
  ExprPtr start;
  if (is_op(":")) {
    advance();
  } else {
    start = expression();
    if (!is_op(":")) return start;
    advance();
  }
  auto s = std::make_unique<SliceExpr>(line);
  s->start = std::move(start);
  if (!is_op(":") && !is_op("]") && !is_op(",")) s->stop = expression();
  if (skip_op(":"))
    if (!is_op("]") && !is_op(",")) s->step = expression();
  return s;
}

CallArgs Parser::call_args() {
  const int line = cur().line;
  expect_op("(");
  CallArgs a;
  bool require_comma = false;
  auto ensure = [&](bool ok) {
    if (!ok) fail("invalid syntax for function call expression", line);
  };
  while (!is_op(")")) {
    if (require_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*")) {
      ensure(!a.star && !a.star_star);
      advance();
      a.star = expression();
    } else if (is_op("**")) {
      ensure(!a.star_star);
      advance();
      a.star_star = expression();
    } else if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
      ensure(!a.star_star);
      std::string key = advance().text;
      advance();
      a.kw.emplace_back(std::move(key), expression());
    } else {
      ensure(!a.star && !a.star_star && a.kw.empty());
      a.pos.push_back(expression());
    }
    require_comma = true;
  }
  expect_op(")");
  return a;
}

ExprPtr Parser::call(ExprPtr node) {
  auto c = std::make_unique<CallExpr>(cur().line);
  c->args = call_args();
  c->fn = std::move(node);
  return c;
}

ExprPtr Parser::filter_chain(ExprPtr node, bool start_inline) {
  ChainDepth chain(depth_);
  while (is_op("|") || start_inline) {
    deepen(chain.extra, cur().line);
    if (!start_inline) advance();
    auto f = std::make_unique<FilterExpr>(cur().line);
    f->name = expect_name();
    while (skip_op(".")) f->name += "." + expect_name();
    if (is_op("(")) f->args = call_args();
    f->operand = std::move(node);
    node = std::move(f);
    start_inline = false;
  }
  return node;
}

ExprPtr Parser::test(ExprPtr node) {
  const int line = advance().line;
  const bool negated = skip_name("not");
  auto t = std::make_unique<TestExpr>(line);
  t->name = expect_name();
  while (skip_op(".")) t->name += "." + expect_name();
  const Token& c = cur();
  const bool arg_start = c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int || c.type == Tok::Float ||
                         is_op("(") || is_op("[") || is_op("{");
  if (is_op("(")) {
    t->args = call_args();
  } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("You cannot chain multiple tests with is");
    t->args.pos.push_back(postfix(primary()));
  }
  t->operand = std::move(node);
  if (negated) return std::make_unique<UnaryExpr>(UnaryExpr::Op::Not, std::move(t), line);
  return t;
}

ExprPtr Parser::assign_target(bool with_tuple, bool name_only, std::initializer_list<const char*> extra_end,
                              bool with_namespace) {
  const int line = cur().line;
  ExprPtr target;
  if (name_only) {
    if (cur().type != Tok::Name) fail("expected name, got " + describe(cur()));
    target = std::make_unique<NameExpr>(advance().text, line);
  } else if (with_tuple) {
    target = tuple(true, true, extra_end, false, with_namespace);
  } else {
    target = primary(with_namespace);
  }
  auto assignable = [](const Expr& e) { return e.kind == Expr::Kind::Name || e.kind == Expr::Kind::NsRef; };
  bool ok = assignable(*target);
  if (target->kind == Expr::Kind::List) {
    ok = static_cast<ListExpr&>(*target).tuple;
    for (const auto& x : static_cast<ListExpr&>(*target).items) ok = ok && assignable(*x);
  }
  if (!ok)
    fail("can't assign to '" + std::string(target->kind == Expr::Kind::Const ? "const" : "expression") + "'", line);
  return target;
}

}  // namespace kvs::jinja
