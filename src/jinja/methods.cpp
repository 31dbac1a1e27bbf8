#include "jinja/methods.h"

#include <algorithm>
#include <unordered_map>

#include "jinja/args.h"
#include "jinja/ctx.h"
#include "jinja/error.h"
#include "jinja/pyformat.h"
#include "jinja/str_ops.h"
#include "jinja/unicode.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

namespace {

using Method = Value (*)(Ctx&, const Value& self, const Args& a);

std::optional<std::string> opt_str(const ArgReader& r, size_t i, const char* fn) {
  const Value* v = r.get(i);
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) type_error(std::string(fn) + " arg must be None or str");
  return v->str();
}

std::optional<int64_t> opt_int(const ArgReader& r, size_t i) {
  const Value* v = r.get(i);
  if (!v || v->is_none()) return std::nullopt;
  return r.int_or(i, 0);
}

// A string result keeps self's Markup-ness (markupsafe wraps these methods).
Value same_kind(const Value& self, std::string s) {
  return self.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
}

Value str_list(const Value& self, std::vector<std::string> parts) {
  List out;
  for (auto& p : parts) out.push_back(same_kind(self, std::move(p)));
  return Value::list(std::move(out));
}

// An argument a Markup method takes in: escaped unless already Markup.
std::string arg_text(const Value& self, const Value& arg) {
  if (!arg.is_string()) type_error("expected str instance, " + type_name(arg) + " found");
  return self.is_markup() && !arg.is_markup() ? html_escape(arg.str()) : arg.str();
}

Value m_strip(const Value& self, const Args& a, pystr::Side side, const char* fn) {
  ArgReader r(fn, a, {"chars"});
  return same_kind(self, pystr::strip(self.str(), opt_str(r, 0, fn), side));
}

bool affix_match(const Value& self, const Args& a, bool prefix) {
  const char* fn = prefix ? "startswith" : "endswith";
  ArgReader r(fn, a, {"prefix", "start", "end"});
  if (!r.has(0)) type_error(std::string(fn) + "() takes at least 1 argument (0 given)");
  std::string s = self.str();
  if (r.has(1) || r.has(2)) s = pystr::cp_slice(s, opt_int(r, 1), opt_int(r, 2));
  const Value& p = *r.get(0);
  auto one = [&](const Value& x) {
    if (!x.is_string()) type_error(std::string(fn) + " first arg must be str or a tuple of str, not " + type_name(x));
    const std::string& t = x.str();
    if (t.size() > s.size()) return false;
    return prefix ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  if (p.is_tuple()) return std::any_of(p.items().begin(), p.items().end(), one);
  return one(p);
}

Value m_split(const Value& self, const Args& a, bool right) {
  const char* fn = right ? "rsplit" : "split";
  ArgReader r(fn, a, {"sep", "maxsplit"});
  const auto sep = opt_str(r, 0, fn);
  const int64_t max = r.int_or(1, -1);
  return str_list(self, right ? pystr::rsplit(self.str(), sep, max) : pystr::split(self.str(), sep, max));
}

Value m_find(const Value& self, const Args& a, bool reverse, bool raise, const char* fn) {
  ArgReader r(fn, a, {"sub", "start", "end"});
  if (!r.has(0) || !r.get(0)->is_string()) type_error(std::string(fn) + "() argument must be str");
  const int64_t at = pystr::find(self.str(), r.get(0)->str(), opt_int(r, 1), opt_int(r, 2), reverse);
  if (at < 0 && raise) throw EvalError("ValueError: substring not found");
  return Value(at);
}

Value m_join(Ctx& ctx, const Value& self, const Args& a) {
  ArgReader r("join", a, {"iterable"});
  if (!r.has(0)) type_error("join() takes exactly one argument (0 given)");
  std::string out;
  size_t i = 0;
  Iter it = iterate(*r.get(0));
  while (auto x = it()) {
    if (!x->is_string())
      type_error("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(*x) + " found");
    if (i++) out += self.str();
    out += arg_text(self, *x);
    ctx.charge(x->str().size() + self.str().size());
  }
  return same_kind(self, std::move(out));
}

Value m_replace(Ctx& ctx, const Value& self, const Args& a) {
  ArgReader r("replace", a, {"old", "new", "count"});
  if (!r.has(0) || !r.has(1)) type_error("replace() takes at least 2 arguments");
  const std::string old = arg_text(self, *r.get(0)), repl = arg_text(self, *r.get(1));
  std::string out = pystr::replace(self.str(), old, repl, r.int_or(2, -1));
  ctx.charge(out.size());
  return same_kind(self, std::move(out));
}

Value m_pad(const Value& self, const Args& a, int align, const char* fn) {
  ArgReader r(fn, a, {"width", "fillchar"});
  const std::string fill = r.str_or(1, " ");
  if (uni::length(fill) != 1) type_error("The fill character must be exactly one character long");
  return same_kind(self, pystr::pad(self.str(), r.int_or(0, 0), fill, align));
}

Value m_partition(const Value& self, const Args& a, bool right) {
  ArgReader r(right ? "rpartition" : "partition", a, {"sep"});
  if (!r.has(0) || !r.get(0)->is_string()) type_error("must be str");
  const std::string& s = self.str();
  const std::string& sep = r.get(0)->str();
  if (sep.empty()) throw EvalError("ValueError: empty separator");
  const size_t at = right ? s.rfind(sep) : s.find(sep);
  if (at == std::string::npos)
    return right ? Value::tuple({same_kind(self, ""), same_kind(self, ""), self})
                 : Value::tuple({self, same_kind(self, ""), same_kind(self, "")});
  return Value::tuple(
      {same_kind(self, s.substr(0, at)), same_kind(self, sep), same_kind(self, s.substr(at + sep.size()))});
}

template <class Pred>
Value all_chars(const Value& self, Pred p) {
  const std::string& s = self.str();
  if (s.empty()) return Value(false);
  for (size_t i = 0; i < s.size();)
    if (!p(uni::next(s, i))) return Value(false);
  return Value(true);
}

// islower / isupper: at least one cased character, none of the other case.
Value case_test(const Value& self, bool want_lower) {
  bool cased = false;
  const std::string& s = self.str();
  for (size_t i = 0; i < s.size();) {
    const char32_t c = uni::next(s, i);
    if (want_lower ? uni::is_upper(c) : uni::is_lower(c)) return Value(false);
    cased = cased || uni::is_cased(c);
  }
  return Value(cased);
}

const std::unordered_map<std::string, Method>& str_predicates() {
  static const std::unordered_map<std::string, Method> m = {
      {"isspace", [](Ctx&, const Value& s, const Args&) { return all_chars(s, uni::is_space); }},
      {"isdigit", [](Ctx&, const Value& s, const Args&) { return all_chars(s, uni::is_digit); }},
      {"isdecimal", [](Ctx&, const Value& s, const Args&) { return all_chars(s, uni::is_digit); }},
      {"isnumeric", [](Ctx&, const Value& s, const Args&) { return all_chars(s, uni::is_digit); }},
      {"isalpha", [](Ctx&, const Value& s, const Args&) { return all_chars(s, uni::is_alpha); }},
      {"isalnum",
       [](Ctx&, const Value& s, const Args&) {
         return all_chars(s, [](char32_t c) { return uni::is_alpha(c) || uni::is_digit(c); });
       }},
      {"isascii",
       [](Ctx&, const Value& s, const Args&) {
         return Value(std::all_of(s.str().begin(), s.str().end(), [](char c) { return (unsigned char)c < 0x80; }));
       }},
      {"islower", [](Ctx&, const Value& s, const Args&) { return case_test(s, true); }},
      {"isupper", [](Ctx&, const Value& s, const Args&) { return case_test(s, false); }},
  };
  return m;
}

const std::unordered_map<std::string, Method>& str_methods() {
  static const std::unordered_map<std::string, Method> m = {
      {"strip", [](Ctx&, const Value& s, const Args& a) { return m_strip(s, a, pystr::Side::Both, "strip"); }},
      {"lstrip", [](Ctx&, const Value& s, const Args& a) { return m_strip(s, a, pystr::Side::Left, "lstrip"); }},
      {"rstrip", [](Ctx&, const Value& s, const Args& a) { return m_strip(s, a, pystr::Side::Right, "rstrip"); }},
      {"split", [](Ctx&, const Value& s, const Args& a) { return m_split(s, a, false); }},
      {"rsplit", [](Ctx&, const Value& s, const Args& a) { return m_split(s, a, true); }},
      {"splitlines",
       [](Ctx&, const Value& s, const Args& a) {
         ArgReader r("splitlines", a, {"keepends"});
         return str_list(s, pystr::splitlines(s.str(), r.bool_or(0, false)));
       }},
      {"startswith", [](Ctx&, const Value& s, const Args& a) { return Value(affix_match(s, a, true)); }},
      {"endswith", [](Ctx&, const Value& s, const Args& a) { return Value(affix_match(s, a, false)); }},
      {"replace", m_replace},
      {"join", m_join},
      {"find", [](Ctx&, const Value& s, const Args& a) { return m_find(s, a, false, false, "find"); }},
      {"rfind", [](Ctx&, const Value& s, const Args& a) { return m_find(s, a, true, false, "rfind"); }},
      {"index", [](Ctx&, const Value& s, const Args& a) { return m_find(s, a, false, true, "index"); }},
      {"rindex", [](Ctx&, const Value& s, const Args& a) { return m_find(s, a, true, true, "rindex"); }},
      {"count",
       [](Ctx&, const Value& s, const Args& a) {
         ArgReader r("count", a, {"sub"});
         if (!r.has(0) || !r.get(0)->is_string()) type_error("count() argument must be str");
         return Value(pystr::count(s.str(), r.get(0)->str()));
       }},
      {"upper", [](Ctx&, const Value& s, const Args&) { return same_kind(s, uni::to_upper(s.str())); }},
      {"lower", [](Ctx&, const Value& s, const Args&) { return same_kind(s, uni::to_lower(s.str())); }},
      {"casefold", [](Ctx&, const Value& s, const Args&) { return Value(uni::to_lower(s.str())); }},
      {"title", [](Ctx&, const Value& s, const Args&) { return same_kind(s, uni::title(s.str())); }},
      {"capitalize", [](Ctx&, const Value& s, const Args&) { return same_kind(s, uni::capitalize(s.str())); }},
      {"swapcase",
       [](Ctx&, const Value& s, const Args&) {
         std::string out;
         for (size_t i = 0; i < s.str().size();) {
           const char32_t c = uni::next(s.str(), i);
           if (uni::is_upper(c))
             uni::append(out, uni::lower(c));
           else
             uni::append_upper(out, c);
         }
         return same_kind(s, std::move(out));
       }},
      {"center", [](Ctx&, const Value& s, const Args& a) { return m_pad(s, a, 0, "center"); }},
      {"ljust", [](Ctx&, const Value& s, const Args& a) { return m_pad(s, a, -1, "ljust"); }},
      {"rjust", [](Ctx&, const Value& s, const Args& a) { return m_pad(s, a, 1, "rjust"); }},
      {"zfill",
       [](Ctx&, const Value& s, const Args& a) {
         ArgReader r("zfill", a, {"width"});
         return same_kind(s, pystr::zfill(s.str(), r.int_or(0, 0)));
       }},
      {"partition", [](Ctx&, const Value& s, const Args& a) { return m_partition(s, a, false); }},
      {"rpartition", [](Ctx&, const Value& s, const Args& a) { return m_partition(s, a, true); }},
      {"removeprefix",
       [](Ctx&, const Value& s, const Args& a) {
         ArgReader r("removeprefix", a, {"prefix"});
         const std::string p = r.str_or(0, "");
         return s.str().compare(0, p.size(), p) == 0 ? same_kind(s, s.str().substr(p.size())) : s;
       }},
      {"removesuffix",
       [](Ctx&, const Value& s, const Args& a) {
         ArgReader r("removesuffix", a, {"suffix"});
         const std::string p = r.str_or(0, "");
         const std::string& t = s.str();
         return !p.empty() && t.size() >= p.size() && t.compare(t.size() - p.size(), p.size(), p) == 0
                    ? same_kind(s, t.substr(0, t.size() - p.size()))
                    : s;
       }},
      {"format", [](Ctx& ctx, const Value& s,
                    const Args& a) { return same_kind(s, str_format(ctx, s.str(), a, s.is_markup())); }},
  };
  return m;
}

Value dict_items(const Value& self) {
  List out;
  for (const auto& [k, v] : self.dict().entries) out.push_back(Value::tuple({k, v}));
  return Value::list(std::move(out));
}

const std::unordered_map<std::string, Method>& dict_methods() {
  static const std::unordered_map<std::string, Method> m = {
      {"items", [](Ctx&, const Value& s, const Args&) { return dict_items(s); }},
      {"keys",
       [](Ctx&, const Value& s, const Args&) {
         List out;
         for (const auto& e : s.dict().entries) out.push_back(e.first);
         return Value::list(std::move(out));
       }},
      {"values",
       [](Ctx&, const Value& s, const Args&) {
         List out;
         for (const auto& e : s.dict().entries) out.push_back(e.second);
         return Value::list(std::move(out));
       }},
      {"get",
       [](Ctx&, const Value& s, const Args& a) {
         ArgReader r("get", a, {"key", "default"});
         if (!r.has(0)) type_error("get expected at least 1 argument, got 0");
         const Value* v = s.dict().find(*r.get(0));
         return v ? *v : r.get_or(1, Value::none());
       }},
      {"copy", [](Ctx&, const Value& s, const Args&) { return s; }},
  };
  return m;
}

Value list_index(const Value& self, const Args& a) {
  ArgReader r("index", a, {"value", "start", "stop"});
  if (!r.has(0)) type_error("index expected at least 1 argument, got 0");
  const List& items = self.items();
  const SliceIdx ix =
      slice_indices(r.get_or(1, Value::none()), r.get_or(2, Value::none()), Value::none(), int64_t(items.size()));
  for (int64_t i = ix.start; i < ix.stop; ++i)
    if (py_equal(items[size_t(i)], *r.get(0))) return Value(i);
  throw EvalError("ValueError: " + py_repr(*r.get(0)) + " is not in list");
}

const std::unordered_map<std::string, Method>& list_methods() {
  static const std::unordered_map<std::string, Method> m = {
      {"index", [](Ctx&, const Value& s, const Args& a) { return list_index(s, a); }},
      {"count",
       [](Ctx&, const Value& s, const Args& a) {
         ArgReader r("count", a, {"value"});
         if (!r.has(0)) type_error("count() takes exactly one argument (0 given)");
         return Value(int64_t(std::count_if(s.items().begin(), s.items().end(),
                                            [&](const Value& x) { return py_equal(x, *r.get(0)); })));
       }},
      {"copy", [](Ctx&, const Value& s, const Args&) { return Value::list(s.items()); }},
  };
  return m;
}

bool refused(const Value& self, const std::string& name) {
  static const char* kList[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
  static const char* kDict[] = {"clear", "pop", "popitem", "setdefault", "update"};
  if (self.is_list() && !self.is_tuple())
    return std::any_of(std::begin(kList), std::end(kList), [&](const char* n) { return name == n; });
  if (self.is_dict()) return std::any_of(std::begin(kDict), std::end(kDict), [&](const char* n) { return name == n; });
  return false;
}

}  // namespace

std::optional<Value> method_of(const Value& self, const std::string& name) {
  const std::unordered_map<std::string, Method>* table = nullptr;
  if (self.is_string())
    table = &str_methods();
  else if (self.is_dict())
    table = &dict_methods();
  else if (self.is_list())
    table = &list_methods();
  if (!table) return std::nullopt;
  if (refused(self, name))
    return Value::undefined("access to attribute '" + name + "' of '" + type_name(self) + "' object is unsafe.", true);
  auto it = table->find(name);
  if (it == table->end()) return std::nullopt;
  const Method fn = it->second;
  return make_function(
      name, [self, fn](Ctx& ctx, Args& a) { return fn(ctx, self, a); }, "built-in method");
}

}  // namespace kvs::jinja
