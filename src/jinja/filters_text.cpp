// The filters on strings and numbers, the filter table, and tojson.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "jinja/args.h"
#include "jinja/error.h"
#include "jinja/filters.h"
#include "jinja/filters_seq.h"
#include "jinja/json_value.h"
#include "jinja/pyformat.h"
#include "jinja/str_ops.h"
#include "jinja/unicode.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

namespace {

// Jinja2's soft_str: a string (Markup or not) stays itself, anything else is str().
Value soft_str(const Value& v) { return v.is_string() ? v : Value(py_str(v)); }
Value same_kind(const Value& like, std::string s) {
  return like.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
}

Value f_default(Ctx&, const Value& v, const Args& a) {
  ArgReader r("default", a, {"default_value", "boolean"});
  if (v.is_undefined() || (r.bool_or(1, false) && !truthy(v))) return r.get_or(0, Value(""));
  return v;
}

Value f_trim(Ctx&, const Value& v, const Args& a) {
  ArgReader r("trim", a, {"chars"});
  const Value s = soft_str(v);
  std::optional<std::string> chars;
  if (r.has(0) && !r.get(0)->is_none()) chars = r.str_or(0, "");
  return same_kind(s, pystr::strip(s.str(), chars));
}

Value f_replace(Ctx& ctx, const Value& v, const Args& a) {
  ArgReader r("replace", a, {"old", "new", "count"});
  if (!r.has(0) || !r.has(1)) type_error("do_replace() missing required arguments 'old' and 'new'");
  std::string out = pystr::replace(py_str(v), py_str(*r.get(0)), py_str(*r.get(1)), r.int_or(2, -1));
  ctx.charge(out.size());
  return Value(std::move(out));
}

// Jinja2's do_title: words start after whitespace or -({[<.
Value f_title(Ctx&, const Value& v, const Args& a) {
  no_args("title", a);
  const Value s = soft_str(v);
  std::string out;
  bool start = true;
  for (size_t i = 0; i < s.str().size();) {
    const char32_t c = uni::next(s.str(), i);
    const bool sep = uni::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep)
      uni::append(out, c);
    else if (start)
      uni::append_upper(out, c);
    else
      uni::append(out, uni::lower(c));
    start = sep;
  }
  return same_kind(s, std::move(out));
}

Value f_indent(Ctx& ctx, const Value& v, const Args& a) {
  ArgReader r("indent", a, {"width", "first", "blank"});
  const Value s = soft_str(v);
  std::string ind;
  if (r.has(0) && r.get(0)->is_string())
    ind = r.get(0)->str();
  else
    ind = std::string(size_t(std::max<int64_t>(0, r.int_or(0, 4))), ' ');
  const bool first = r.bool_or(1, false), blank = r.bool_or(2, false);
  const std::vector<std::string> lines = pystr::splitlines(s.str() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if (i && (blank || !lines[i].empty())) out += ind;
    out += lines[i];
  }
  if (first) out = ind + out;
  ctx.charge(out.size());
  return same_kind(s, std::move(out));
}

Value f_wordcount(Ctx&, const Value& v, const Args& a) {
  no_args("wordcount", a);
  const std::string s = py_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    const bool w = uni::is_word(uni::next(s, i));
    n += w && !in_word;
    in_word = w;
  }
  return Value(n);
}

Value f_center(Ctx&, const Value& v, const Args& a) {
  ArgReader r("center", a, {"width"});
  const Value s = soft_str(v);
  return same_kind(s, pystr::pad(s.str(), r.int_or(0, 80), " ", 0));
}

Value f_truncate(Ctx&, const Value& v, const Args& a) {
  ArgReader r("truncate", a, {"length", "killwords", "end", "leeway"});
  const std::string s = py_str(v), end = r.str_or(2, "...");
  const int64_t length = r.int_or(0, 255), leeway = r.int_or(3, 5);
  const int64_t n = int64_t(uni::length(s)), end_len = int64_t(uni::length(end));
  if (length < end_len) throw EvalError("AssertionError: expected length >= " + std::to_string(end_len));
  if (n <= length + leeway) return Value(s);
  std::string head = pystr::cp_slice(s, 0, length - end_len);
  if (!r.bool_or(1, false)) head = pystr::rsplit(head, std::string(" "), 1)[0];
  return Value(head + end);
}

// Python's float(str): whitespace, sign, digits with single underscores, inf, nan.
std::optional<double> parse_float(const std::string& text) {
  std::string s = pystr::strip(text, std::nullopt);
  std::string t;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) t += s[i++];
  std::string rest = uni::to_lower(s.substr(i));
  if (rest == "inf" || rest == "infinity" || rest == "nan") return std::strtod((t + rest).c_str(), nullptr);
  bool digits = false, dot = false, exp = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits = true;
      t += c;
    } else if (c == '_' && i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1])) && i + 1 < s.size() &&
               std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    } else if (c == '.' && !dot && !exp) {
      dot = true;
      t += c;
    } else if ((c == 'e' || c == 'E') && digits && !exp) {
      exp = true;
      t += 'e';
      if (i + 1 < s.size() && (s[i + 1] == '+' || s[i + 1] == '-')) t += s[++i];
      if (i + 1 >= s.size()) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  return std::strtod(t.c_str(), nullptr);
}

// Python's int(str, base) for base 10 and 0/2/8/16 prefixes.
std::optional<int64_t> parse_int(const std::string& text, int64_t base) {
  std::string s = pystr::strip(text, std::nullopt);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  auto prefix = [&](char p) {
    return i + 1 < s.size() && s[i] == '0' && std::tolower(static_cast<unsigned char>(s[i + 1])) == p;
  };
  if (base == 0) base = prefix('x') ? 16 : prefix('o') ? 8 : prefix('b') ? 2 : 10;
  if ((base == 16 && prefix('x')) || (base == 8 && prefix('o')) || (base == 2 && prefix('b'))) {
    i += 2;
    if (i < s.size() && s[i] == '_') ++i;
  }
  if (i >= s.size() || base < 2 || base > 36) return std::nullopt;
  uint64_t v = 0;
  bool last_digit = false;
  for (; i < s.size(); ++i) {
    const char c = char(std::tolower(static_cast<unsigned char>(s[i])));
    if (c == '_' && last_digit && i + 1 < s.size()) {
      last_digit = false;
      continue;
    }
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c >= 'a' && c <= 'z') ? c - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, uint64_t(base), &v) || __builtin_add_overflow(v, uint64_t(d), &v))
      return std::nullopt;
    last_digit = true;
  }
  if (!last_digit || v > uint64_t(INT64_MAX)) return std::nullopt;
  return neg ? -int64_t(v) : int64_t(v);
}

Value f_int(Ctx&, const Value& v, const Args& a) {
  ArgReader r("int", a, {"default", "base"});
  const Value dflt = r.get_or(0, Value(int64_t(0)));
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_integral()) return Value(v.as_int());
  if (v.is_float()) {
    if (!std::isfinite(v.as_float()) || std::fabs(v.as_float()) >= 9.2e18) return dflt;
    return Value(int64_t(std::trunc(v.as_float())));
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.str(), r.int_or(1, 10))) return Value(*i);
    if (auto f = parse_float(v.str()); f && std::isfinite(*f) && std::fabs(*f) < 9.2e18)
      return Value(int64_t(std::trunc(*f)));
  }
  return dflt;
}

Value f_float(Ctx&, const Value& v, const Args& a) {
  ArgReader r("float", a, {"default"});
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string())
    if (auto f = parse_float(v.str())) return Value(*f);
  return r.get_or(0, Value(0.0));
}

Value f_abs(Ctx&, const Value& v, const Args& a) {
  no_args("abs", a);
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) throw EvalError("OverflowError: integer result out of the 64-bit range");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  type_error("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_round(Ctx&, const Value& v, const Args& a) {
  ArgReader r("round", a, {"precision", "method"});
  const int64_t p = r.int_or(0, 0);
  const std::string method = r.str_or(1, "common");
  if (method != "common" && method != "ceil" && method != "floor")
    throw EvalError("FilterArgumentError: method must be common, ceil or floor");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) type_error("type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (v.is_integral() && p >= 0) return Value(v.as_int());
    const double x = v.as_float();
    if (!std::isfinite(x)) return Value(x);
    if (p >= 0 && p <= 300) {
      // Correctly rounded, half to even, as Python's round() (via the exact decimal).
      char buf[400];
      std::snprintf(buf, sizeof buf, "%.*f", int(p), x);
      return Value(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, double(-p));
    return Value(std::nearbyint(x / scale) * scale);
  }
  const double scale = std::pow(10.0, double(p));
  const double x = v.as_float() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_format(Ctx& ctx, const Value& v, const Args& a) {
  if (!a.pos.empty() && !a.kw.empty())
    throw EvalError("FilterArgumentError: can't handle positional and keyword arguments at the same time");
  Dict named;
  for (const auto& [k, x] : a.kw) named.set(Value(k), x);
  return percent_format(ctx, soft_str(v), a.kw.empty() ? Value::tuple(a.pos) : Value::dict(std::move(named)));
}

Value f_filesizeformat(Ctx&, const Value& v, const Args& a) {
  ArgReader r("filesizeformat", a, {"binary"});
  const bool bin = r.bool_or(0, false);
  const double bytes = v.is_number() ? v.as_float() : v.is_string() ? parse_float(v.str()).value_or(NAN) : NAN;
  if (std::isnan(bytes)) type_error("float() argument must be a string or a real number");
  const double base = bin ? 1024 : 1000;
  static const char* kBin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  static const char* kDec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  if (bytes == 1) return Value("1 Byte");
  if (bytes < base) return Value(std::to_string(int64_t(bytes)) + " Bytes");
  double unit = base;
  int i = 0;
  for (; i < 8; ++i) {
    unit = std::pow(base, i + 2);
    if (bytes < unit) break;
  }
  if (i == 8) i = 7;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s", base * bytes / unit, bin ? kBin[i] : kDec[i]);
  return Value(buf);
}

// Hugging Face's tojson: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys), not Jinja2's HTML-safe one.
Value f_tojson(Ctx& ctx, const Value& v, const Args& a) {
  ArgReader r("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = r.bool_or(0, false);
  if (const Value* ind = r.get(1); ind && !ind->is_none()) {
    if (ind->is_string())
      o.indent = ind->str();
    else if (ind->is_integral())
      o.indent = std::string(size_t(std::max<int64_t>(0, ind->as_int())), ' ');
    else
      type_error("indent must be an int or a str");
  }
  if (const Value* sep = r.get(2); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->items().size() != 2 || !sep->items()[0].is_string() || !sep->items()[1].is_string())
      throw EvalError("ValueError: separators must be a pair of strings");
    o.item_sep = sep->items()[0].str();
    o.key_sep = sep->items()[1].str();
  }
  o.sort_keys = r.bool_or(3, false);
  std::string out = json_dumps(v, o);
  ctx.charge(out.size());
  return Value(std::move(out));
}

using Table = std::unordered_map<std::string, FilterFn>;

const Table& text_filters() {
  static const Table t = {
      {"default", f_default},
      {"d", f_default},
      {"trim", f_trim},
      {"replace", f_replace},
      {"title", f_title},
      {"indent", f_indent},
      {"wordcount", f_wordcount},
      {"center", f_center},
      {"truncate", f_truncate},
      {"int", f_int},
      {"float", f_float},
      {"abs", f_abs},
      {"round", f_round},
      {"format", f_format},
      {"filesizeformat", f_filesizeformat},
      {"tojson", f_tojson},
      {"string",
       [](Ctx&, const Value& v, const Args& a) {
         no_args("string", a);
         return soft_str(v);
       }},
      {"lower",
       [](Ctx&, const Value& v, const Args& a) {
         no_args("lower", a);
         const Value s = soft_str(v);
         return same_kind(s, uni::to_lower(s.str()));
       }},
      {"upper",
       [](Ctx&, const Value& v, const Args& a) {
         no_args("upper", a);
         const Value s = soft_str(v);
         return same_kind(s, uni::to_upper(s.str()));
       }},
      {"capitalize",
       [](Ctx&, const Value& v, const Args&) {
         const Value s = soft_str(v);
         return same_kind(s, uni::capitalize(s.str()));
       }},
      {"safe", [](Ctx&, const Value& v, const Args&) { return v.is_markup() ? v : Value::markup(py_str(v)); }},
      {"escape", [](Ctx&, const Value& v, const Args&) { return escape(v); }},
      {"e", [](Ctx&, const Value& v, const Args&) { return escape(v); }},
      {"forceescape", [](Ctx&, const Value& v, const Args&) { return Value::markup(html_escape(py_str(v))); }},
  };
  return t;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = text_filters().find(name);
  return it != text_filters().end() ? it->second : find_seq_filter(name);
}

bool has_filter(const std::string& name) { return find_filter(name) != nullptr; }

}  // namespace kvs::jinja
