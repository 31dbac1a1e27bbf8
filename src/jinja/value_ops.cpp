#include "jinja/value_ops.h"

#include <cmath>
#include <limits>

#include "jinja/error.h"
#include "jinja/methods.h"
#include "jinja/pyformat.h"
#include "jinja/unicode.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

void fail_undefined(const Value& u) {
  const std::string& hint = u.undefined_hint();
  if (u.undefined_unsafe()) throw EvalError("SecurityError: " + hint);
  throw EvalError("UndefinedError: " + (hint.empty() ? std::string("value is undefined") : hint));
}

void type_error(const std::string& message) { throw EvalError("TypeError: " + message); }

namespace {

const char* op_symbol(BinOp op) {
  switch (op) {
    case BinOp::Add: return "+";
    case BinOp::Sub: return "-";
    case BinOp::Mul: return "*";
    case BinOp::Div: return "/";
    case BinOp::FloorDiv: return "//";
    case BinOp::Mod: return "%";
    case BinOp::Pow: return "** or pow()";
  }
  return "?";
}

[[noreturn]] void unsupported(BinOp op, const Value& a, const Value& b) {
  type_error(std::string("unsupported operand type(s) for ") + op_symbol(op) + ": '" + type_name(a) + "' and '" +
             type_name(b) + "'");
}

[[noreturn]] void overflow() { throw EvalError("OverflowError: integer result out of the 64-bit range"); }

void float_divmod(double x, double y, double& div, double& mod) {
  // Python's float floor division and modulo (Objects/floatobject.c).
  mod = std::fmod(x, y);
  div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  if (div != 0) {
    const double f = std::floor(div);
    div = (div - f > 0.5) ? f + 1.0 : f;
  } else {
    div = std::copysign(0.0, x / y);
  }
}

Value int_pow(int64_t base, int64_t e) {
  int64_t r = 1;
  while (e > 0) {
    if (e & 1 && __builtin_mul_overflow(r, base, &r)) overflow();
    e >>= 1;
    if (e && __builtin_mul_overflow(base, base, &base)) overflow();
  }
  return Value(r);
}

Value arith(BinOp op, const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) {
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    switch (op) {
      case BinOp::Add:
        if (__builtin_add_overflow(x, y, &r)) overflow();
        return Value(r);
      case BinOp::Sub:
        if (__builtin_sub_overflow(x, y, &r)) overflow();
        return Value(r);
      case BinOp::Mul:
        if (__builtin_mul_overflow(x, y, &r)) overflow();
        return Value(r);
      case BinOp::Div:
        if (y == 0) throw EvalError("ZeroDivisionError: division by zero");
        return Value(double(x) / double(y));
      case BinOp::FloorDiv:
      case BinOp::Mod: {
        if (y == 0) throw EvalError("ZeroDivisionError: integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) overflow();
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          m += y;
          q -= 1;
        }
        return Value(op == BinOp::Mod ? m : q);
      }
      case BinOp::Pow:
        if (y < 0) {
          if (x == 0) throw EvalError("ZeroDivisionError: 0.0 cannot be raised to a negative power");
          return Value(std::pow(double(x), double(y)));
        }
        return int_pow(x, y);
    }
  }
  const double x = a.as_float(), y = b.as_float();
  switch (op) {
    case BinOp::Add: return Value(x + y);
    case BinOp::Sub: return Value(x - y);
    case BinOp::Mul: return Value(x * y);
    case BinOp::Div:
      if (y == 0) throw EvalError("ZeroDivisionError: float division by zero");
      return Value(x / y);
    case BinOp::FloorDiv:
    case BinOp::Mod: {
      if (y == 0) throw EvalError("ZeroDivisionError: float floor division by zero");
      double d, m;
      float_divmod(x, y, d, m);
      return Value(op == BinOp::Mod ? m : d);
    }
    case BinOp::Pow:
      if (x == 0 && y < 0) throw EvalError("ZeroDivisionError: 0.0 cannot be raised to a negative power");
      return Value(std::pow(x, y));
  }
  return Value();
}

Value add_strings(Ctx& ctx, const Value& a, const Value& b) {
  ctx.charge(a.str().size() + b.str().size());
  // Markup + str escapes the plain side (markupsafe's __add__ / __radd__).
  if (a.is_markup() && !b.is_markup()) return Value::markup(a.str() + html_escape(b.str()));
  if (!a.is_markup() && b.is_markup()) return Value::markup(html_escape(a.str()) + b.str());
  if (a.is_markup()) return Value::markup(a.str() + b.str());
  return Value(a.str() + b.str());
}

Value repeat(Ctx& ctx, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    ctx.charge(uint64_t(n) * seq.str().size());
    std::string out;
    out.reserve(size_t(n) * seq.str().size());
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return seq.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
  }
  ctx.charge(uint64_t(n) * seq.items().size() * sizeof(Value));
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

}  // namespace

Value binary(Ctx& ctx, BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) return arith(op, a, b);
  switch (op) {
    case BinOp::Add:
      if (a.is_string() && b.is_string()) return add_strings(ctx, a, b);
      if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
        ctx.charge((a.items().size() + b.items().size()) * sizeof(Value));
        List out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return a.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
      }
      if (a.is_string() && !a.is_markup()) type_error("can only concatenate str (not \"" + type_name(b) + "\") to str");
      if (a.is_list() && !a.is_tuple()) type_error("can only concatenate list (not \"" + type_name(b) + "\") to list");
      break;
    case BinOp::Mul:
      if ((a.is_string() || a.is_list()) && b.is_integral()) return repeat(ctx, a, b.as_int());
      if (a.is_integral() && (b.is_string() || b.is_list())) return repeat(ctx, b, a.as_int());
      break;
    case BinOp::Mod:
      if (a.is_string()) return percent_format(ctx, a, b);
      break;
    default: break;
  }
  unsupported(op, a, b);
}

Value negate(const Value& a) {
  if (a.is_undefined()) fail_undefined(a);
  if (a.is_integral()) {
    if (a.as_int() == std::numeric_limits<int64_t>::min()) overflow();
    return Value(-a.as_int());
  }
  if (a.is_float()) return Value(-a.as_float());
  type_error("bad operand type for unary -: '" + type_name(a) + "'");
}

Value unary_plus(const Value& a) {
  if (a.is_undefined()) fail_undefined(a);
  if (a.is_integral()) return Value(a.as_int());
  if (a.is_float()) return a;
  type_error("bad operand type for unary +: '" + type_name(a) + "'");
}

std::string concat_str(const Value& v) { return py_str(v); }

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::Undefined:
    case Value::Type::None: return true;
    case Value::Type::String: return a.str() == b.str();
    case Value::Type::List: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!py_equal(a.items()[i], b.items()[i])) return false;
      return true;
    }
    case Value::Type::Dict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict().entries) {
        const Value* o = b.dict().find(k);
        if (!o || !py_equal(v, *o)) return false;
      }
      return true;
    }
    case Value::Type::Object: return a.object() == b.object();
    default: return false;
  }
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int();
    return a.as_float() < b.as_float();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const List &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  type_error("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool contains(Ctx& ctx, const Value& c, const Value& item) {
  switch (c.type()) {
    case Value::Type::String:
      if (!item.is_string()) type_error("'in <string>' requires string as left operand, not " + type_name(item));
      return c.str().find(item.str()) != std::string::npos;
    case Value::Type::List:
      for (const Value& x : c.items())
        if (py_equal(x, item)) return true;
      return false;
    case Value::Type::Dict: return c.dict().find(item) != nullptr;
    case Value::Type::Undefined: return false;
    case Value::Type::Object:
      if (auto* g = c.object_as<Generator>()) {
        while (auto x = g->pull()) {
          ctx.step();
          if (py_equal(*x, item)) return true;
        }
        return false;
      }
      break;
    default: break;
  }
  type_error("argument of type '" + type_name(c) + "' is not iterable");
}

bool compare(Ctx& ctx, CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::Eq: return py_equal(a, b);
    case CmpOp::Ne: return !py_equal(a, b);
    case CmpOp::Lt: return py_less(a, b);
    case CmpOp::Gt: return py_less(b, a);
    case CmpOp::Le: return py_less(a, b) || py_equal(a, b);
    case CmpOp::Ge: return py_less(b, a) || py_equal(a, b);
    case CmpOp::In: return contains(ctx, b, a);
    case CmpOp::NotIn: return !contains(ctx, b, a);
  }
  return false;
}

namespace {

Value no_attribute(const Value& obj, const std::string& name) {
  return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + name + "'");
}

Value no_element(const Value& obj, const Value& key) {
  return Value::undefined(object_type_repr(obj) + " has no element " + py_repr(key));
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.type()) {
    case Value::Type::Undefined: fail_undefined(obj);
    case Value::Type::Dict: {
      if (auto m = method_of(obj, name)) return *m;
      if (const Value* v = obj.dict().find(std::string_view(name))) return *v;
      return no_attribute(obj, name);
    }
    case Value::Type::Object:
      if (auto v = obj.object()->attr(name)) return *v;
      return no_attribute(obj, name);
    default:
      if (auto m = method_of(obj, name)) return *m;
      return no_attribute(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.type()) {
    case Value::Type::Undefined: fail_undefined(obj);
    case Value::Type::Dict:
      if (const Value* v = obj.dict().find(key)) return *v;
      break;
    case Value::Type::List:
      if (key.is_integral()) {
        const int64_t n = int64_t(obj.items().size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.items()[size_t(i)];
      }
      break;
    case Value::Type::String:
      if (key.is_integral()) {
        const std::vector<char32_t> cps = uni::decode(obj.str());
        const int64_t n = int64_t(cps.size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          std::string s;
          uni::append(s, cps[size_t(i)]);
          return Value(std::move(s));
        }
      }
      break;
    default: break;
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return no_element(obj, key);
}

SliceIdx slice_indices(const Value& start, const Value& stop, const Value& step, int64_t len) {
  auto index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!v.is_integral()) type_error("slice indices must be integers or None or have an __index__ method");
    return v.as_int();
  };
  const std::optional<int64_t> st = index(step);
  const int64_t s = st.value_or(1);
  if (s == 0) throw EvalError("ValueError: slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < 0) x = s < 0 ? -1 : 0;
    } else if (x >= len) {
      x = s < 0 ? len - 1 : len;
    }
    return x;
  };
  SliceIdx r{adjust(index(start), s < 0 ? len - 1 : 0), adjust(index(stop), s < 0 ? -1 : len), s, 0};
  if (s > 0)
    r.count = r.stop > r.start ? (r.stop - r.start + s - 1) / s : 0;
  else
    r.count = r.start > r.stop ? (r.start - r.stop - s - 1) / (-s) : 0;
  return r;
}

Value get_slice(Ctx& ctx, const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (!obj.is_list() && !obj.is_string()) return no_element(obj, Value("slice"));
  auto bad = [](const Value& v) { return !v.is_none() && !v.is_integral(); };
  if (bad(start) || bad(stop) || bad(step)) return Value::undefined("invalid slice of " + object_type_repr(obj));
  if (obj.is_list()) {
    const List& items = obj.items();
    const SliceIdx ix = slice_indices(start, stop, step, int64_t(items.size()));
    ctx.charge(uint64_t(ix.count) * sizeof(Value));
    List out;
    for (int64_t k = 0, i = ix.start; k < ix.count; ++k, i += ix.step) out.push_back(items[size_t(i)]);
    return obj.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  const std::vector<char32_t> cps = uni::decode(obj.str());
  const SliceIdx ix = slice_indices(start, stop, step, int64_t(cps.size()));
  ctx.charge(uint64_t(ix.count) * 4);
  std::string out;
  for (int64_t k = 0, i = ix.start; k < ix.count; ++k, i += ix.step) uni::append(out, cps[size_t(i)]);
  return obj.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
}

Iter iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return [] { return std::optional<Value>(); };
    case Value::Type::List:
      return [v, i = size_t(0)]() mutable -> std::optional<Value> {
        if (i >= v.items().size()) return std::nullopt;
        return v.items()[i++];
      };
    case Value::Type::Dict:
      return [v, i = size_t(0)]() mutable -> std::optional<Value> {
        if (i >= v.dict().entries.size()) return std::nullopt;
        return v.dict().entries[i++].first;
      };
    case Value::Type::String:
      return [v, i = size_t(0)]() mutable -> std::optional<Value> {
        if (i >= v.str().size()) return std::nullopt;
        std::string c;
        uni::append(c, uni::next(v.str(), i));
        return Value(std::move(c));
      };
    case Value::Type::Object:
      if (v.object_as<Generator>()) return [v]() { return v.object_as<Generator>()->pull(); };
      break;
    default: break;
  }
  type_error("'" + type_name(v) + "' object is not iterable");
}

List to_list(Ctx& ctx, const Value& v) {
  if (v.is_list()) return v.items();
  List out;
  Iter it = iterate(v);
  while (auto x = it()) {
    ctx.charge(sizeof(Value));
    out.push_back(std::move(*x));
  }
  return out;
}

size_t py_len(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return 0;
    case Value::Type::String: return uni::length(v.str());
    case Value::Type::List: return v.items().size();
    case Value::Type::Dict: return v.dict().size();
    default: type_error("object of type '" + type_name(v) + "' has no len()");
  }
}

}  // namespace kvs::jinja
