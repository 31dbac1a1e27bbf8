#include "jinja/predicates.h"

#include <unordered_map>

#include "jinja/args.h"
#include "jinja/error.h"
#include "jinja/filters.h"
#include "jinja/unicode.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

namespace {

const Value& one_arg(const Args& a, const char* test) {
  if (a.pos.size() != 1 || !a.kw.empty()) type_error(std::string(test) + "() takes exactly one argument");
  return a.pos[0];
}

bool mod_is(Ctx& ctx, const Value& v, const Value& n, int64_t want) {
  return py_equal(binary(ctx, BinOp::Mod, v, n), Value(want));
}

bool case_is(const Value& v, bool lower) {
  const std::string s = py_str(v);
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = uni::next(s, i);
    if (lower ? uni::is_upper(c) : uni::is_lower(c)) return false;
    cased = cased || uni::is_cased(c);
  }
  return cased;
}

bool same_as(const Value& a, const Value& b) {
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::None:
    case Value::Type::Undefined: return a.identity() == b.identity();
    case Value::Type::Bool: return a.as_bool() == b.as_bool();
    case Value::Type::Int:
      return a.as_int() == b.as_int() && a.as_int() >= -5 && a.as_int() <= 256;  // CPython's cached ints
    default: return a.identity() && a.identity() == b.identity();
  }
}

using Table = std::unordered_map<std::string, TestFn>;

const Table& tests() {
  static const Table t = {
      {"defined", [](Ctx&, const Value& v, const Args&) { return !v.is_undefined(); }},
      {"undefined", [](Ctx&, const Value& v, const Args&) { return v.is_undefined(); }},
      {"none", [](Ctx&, const Value& v, const Args&) { return v.is_none(); }},
      {"boolean", [](Ctx&, const Value& v, const Args&) { return v.is_bool(); }},
      {"true", [](Ctx&, const Value& v, const Args&) { return v.is_bool() && v.as_bool(); }},
      {"false", [](Ctx&, const Value& v, const Args&) { return v.is_bool() && !v.as_bool(); }},
      {"integer", [](Ctx&, const Value& v, const Args&) { return v.is_int(); }},
      {"float", [](Ctx&, const Value& v, const Args&) { return v.is_float(); }},
      {"number", [](Ctx&, const Value& v, const Args&) { return v.is_number(); }},
      {"string", [](Ctx&, const Value& v, const Args&) { return v.is_string(); }},
      {"mapping", [](Ctx&, const Value& v, const Args&) { return v.is_dict(); }},
      {"sequence", [](Ctx&, const Value& v,
                      const Args&) { return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined(); }},
      {"iterable",
       [](Ctx&, const Value& v, const Args&) {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() ||
                v.object_as<Generator>() != nullptr || (v.is_object() && v.object()->type_name() == "LoopContext");
       }},
      {"callable", [](Ctx&, const Value& v, const Args&) { return v.is_object() && v.object()->callable(); }},
      {"escaped", [](Ctx&, const Value& v, const Args&) { return v.is_markup(); }},
      {"lower", [](Ctx&, const Value& v, const Args&) { return case_is(v, true); }},
      {"upper", [](Ctx&, const Value& v, const Args&) { return case_is(v, false); }},
      {"odd", [](Ctx& c, const Value& v, const Args&) { return mod_is(c, v, Value(int64_t(2)), 1); }},
      {"even", [](Ctx& c, const Value& v, const Args&) { return mod_is(c, v, Value(int64_t(2)), 0); }},
      {"divisibleby",
       [](Ctx& c, const Value& v, const Args& a) {
         ArgReader r("divisibleby", a, {"num"});
         if (!r.has(0)) type_error("test_divisibleby() missing 1 required positional argument: 'num'");
         return mod_is(c, v, *r.get(0), 0);
       }},
      {"sameas", [](Ctx&, const Value& v, const Args& a) { return same_as(v, one_arg(a, "sameas")); }},
      {"in", [](Ctx& c, const Value& v, const Args& a) { return contains(c, one_arg(a, "in"), v); }},
      {"filter", [](Ctx&, const Value& v, const Args&) { return v.is_string() && has_filter(v.str()); }},
      {"test", [](Ctx&, const Value& v, const Args&) { return v.is_string() && has_test(v.str()); }},
      {"eq", [](Ctx& c, const Value& v, const Args& a) { return compare(c, CmpOp::Eq, v, one_arg(a, "eq")); }},
      {"ne", [](Ctx& c, const Value& v, const Args& a) { return compare(c, CmpOp::Ne, v, one_arg(a, "ne")); }},
      {"lt", [](Ctx& c, const Value& v, const Args& a) { return compare(c, CmpOp::Lt, v, one_arg(a, "lt")); }},
      {"le", [](Ctx& c, const Value& v, const Args& a) { return compare(c, CmpOp::Le, v, one_arg(a, "le")); }},
      {"gt", [](Ctx& c, const Value& v, const Args& a) { return compare(c, CmpOp::Gt, v, one_arg(a, "gt")); }},
      {"ge", [](Ctx& c, const Value& v, const Args& a) { return compare(c, CmpOp::Ge, v, one_arg(a, "ge")); }},
  };
  return t;
}

TestFn alias(const std::string& name) {
  static const std::unordered_map<std::string, std::string> a = {{"==", "eq"}, {"equalto", "eq"},     {"!=", "ne"},
                                                                 {"<", "lt"},  {"lessthan", "lt"},    {"<=", "le"},
                                                                 {">", "gt"},  {"greaterthan", "gt"}, {">=", "ge"}};
  auto it = a.find(name);
  return it == a.end() ? nullptr : tests().at(it->second);
}

}  // namespace

TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it != tests().end() ? it->second : alias(name);
}

bool has_test(const std::string& name) { return find_test(name) != nullptr; }

}  // namespace kvs::jinja
