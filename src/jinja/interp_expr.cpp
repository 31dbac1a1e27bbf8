// Expression evaluation: each node's Python semantics, with the line of the
// node that failed added to the error.
#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/filters.h"
#include "jinja/interp.h"
#include "jinja/predicates.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

Value Interp::eval(const Expr& e, const ScopePtr& scope) {
  try {
    step();
    return eval_inner(e, scope);
  } catch (const EvalError& x) {
    fail(x, e.line);
  }
}

Value Interp::eval_inner(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case Expr::Kind::Const: return static_cast<const ConstExpr&>(e).value;
    case Expr::Kind::Name: return lookup(static_cast<const NameExpr&>(e).name, scope);
    case Expr::Kind::List: {
      const auto& l = static_cast<const ListExpr&>(e);
      List items;
      items.reserve(l.items.size());
      for (const auto& x : l.items) items.push_back(eval(*x, scope));
      charge(items.size() * sizeof(Value));
      return l.tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case Expr::Kind::Dict: {
      Dict d;
      for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) {
        Value key = eval(*k, scope);
        if (key.is_list() && !key.is_tuple()) type_error("unhashable type: 'list'");
        if (key.is_dict()) type_error("unhashable type: 'dict'");
        d.set(std::move(key), eval(*v, scope));
      }
      charge(d.size() * 2 * sizeof(Value));
      return Value::dict(std::move(d));
    }
    case Expr::Kind::Unary: {
      const auto& u = static_cast<const UnaryExpr&>(e);
      const Value v = eval(*u.operand, scope);
      if (u.op == UnaryExpr::Op::Not) return Value(!truthy(v));
      return u.op == UnaryExpr::Op::Neg ? negate(v) : unary_plus(v);
    }
    case Expr::Kind::Binary: {
      const auto& b = static_cast<const BinaryExpr&>(e);
      const Value l = eval(*b.left, scope);
      return binary(*this, b.op, l, eval(*b.right, scope));
    }
    case Expr::Kind::And:
    case Expr::Kind::Or: {
      const auto& b = static_cast<const BinaryExpr&>(e);
      Value l = eval(*b.left, scope);
      if (truthy(l) == (e.kind == Expr::Kind::Or)) return l;
      return eval(*b.right, scope);
    }
    case Expr::Kind::Concat: {
      std::string s;
      for (const auto& p : static_cast<const ConcatExpr&>(e).parts) s += concat_str(eval(*p, scope));
      charge(s.size());
      return Value(std::move(s));
    }
    case Expr::Kind::Compare: return eval_compare(static_cast<const CompareExpr&>(e), scope);
    case Expr::Kind::Cond: {
      const auto& c = static_cast<const CondExpr&>(e);
      if (truthy(eval(*c.test, scope))) return eval(*c.then, scope);
      if (c.otherwise) return eval(*c.otherwise, scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
    case Expr::Kind::Attr: {
      const auto& a = static_cast<const AttrExpr&>(e);
      return get_attr(eval(*a.obj, scope), a.attr);
    }
    case Expr::Kind::Item: return eval_item(static_cast<const ItemExpr&>(e), scope);
    case Expr::Kind::Call: return eval_call(static_cast<const CallExpr&>(e), scope);
    case Expr::Kind::Filter: return apply_filter(static_cast<const FilterExpr&>(e), scope, nullptr);
    case Expr::Kind::Test: {
      const auto& t = static_cast<const TestExpr&>(e);
      const Value v = eval(*t.operand, scope);
      return Value(test(t.name, v, eval_args(t.args, scope)));
    }
    case Expr::Kind::NsRef: {
      const auto& r = static_cast<const NsRefExpr&>(e);
      return get_attr(lookup(r.name, scope), r.attr);
    }
    case Expr::Kind::Slice: break;
  }
  throw EvalError("internal error: a slice outside a subscript");
}

Value Interp::eval_item(const ItemExpr& i, const ScopePtr& scope) {
  const Value obj = eval(*i.obj, scope);
  if (i.key->kind == Expr::Kind::Slice) {
    const auto& s = static_cast<const SliceExpr&>(*i.key);
    auto part = [&](const ExprPtr& p) { return p ? eval(*p, scope) : Value::none(); };
    const Value start = part(s.start), stop = part(s.stop), step_v = part(s.step);
    return get_slice(*this, obj, start, stop, step_v);
  }
  return get_item(obj, eval(*i.key, scope));
}

Value Interp::eval_compare(const CompareExpr& c, const ScopePtr& scope) {
  Value left = eval(*c.first, scope);
  for (const auto& [op, rhs] : c.rest) {
    Value right = eval(*rhs, scope);
    if (!compare(*this, op, left, right)) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Args Interp::eval_args(const CallArgs& a, const ScopePtr& scope) {
  Args out;
  for (const auto& x : a.pos) out.pos.push_back(eval(*x, scope));
  if (a.star) {
    const List more = to_list(*this, eval(*a.star, scope));
    out.pos.insert(out.pos.end(), more.begin(), more.end());
  }
  for (const auto& [k, x] : a.kw) out.kw.emplace_back(k, eval(*x, scope));
  if (a.star_star) {
    const Value d = eval(*a.star_star, scope);
    if (!d.is_dict()) type_error("argument after ** must be a mapping, not " + type_name(d));
    for (const auto& [k, v] : d.dict().entries) {
      if (!k.is_string()) type_error("keywords must be strings");
      out.kw.emplace_back(k.str(), v);
    }
  }
  return out;
}

Value Interp::eval_call(const CallExpr& c, const ScopePtr& scope, const Value* extra_caller) {
  const Value fn = eval(*c.fn, scope);
  Args args = eval_args(c.args, scope);
  if (extra_caller) args.kw.emplace_back("caller", *extra_caller);
  return call(fn, std::move(args));
}

Value Interp::call(const Value& fn, Args args) {
  if (fn.is_undefined()) fail_undefined(fn);
  if (fn.is_object() && fn.object()->callable()) return fn.object()->call(*this, std::move(args));
  type_error("'" + type_name(fn) + "' object is not callable");
}

Value Interp::apply_filter(const FilterExpr& f, const ScopePtr& scope, const Value* input) {
  // The innermost filter of a block's chain has no operand: it takes the body.
  Value v = !f.operand ? *input
            : f.operand->kind == Expr::Kind::Filter
                ? apply_filter(static_cast<const FilterExpr&>(*f.operand), scope, input)
                : eval(*f.operand, scope);
  try {
    return filter(f.name, v, eval_args(f.args, scope));
  } catch (const EvalError& x) {
    fail(x, f.line);
  }
}

Value Interp::filter(const std::string& name, const Value& v, Args args) {
  FilterFn fn = find_filter(name);
  if (!fn) throw EvalError("TemplateRuntimeError: No filter named '" + name + "' found.");
  return fn(*this, v, args);
}

bool Interp::test(const std::string& name, const Value& v, Args args) {
  TestFn fn = find_test(name);
  if (!fn) throw EvalError("TemplateRuntimeError: No test named '" + name + "' found.");
  return fn(*this, v, args);
}

}  // namespace kvs::jinja
