#include "jinja/value_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja/unicode.h"

namespace kvs::jinja {

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed notation when
  // the decimal exponent is in [-4, 16), else d.ddde+XX.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, 1) + (e > 2 ? sci.substr(2, e - 2) : "");
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + m + eb;
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(size_t(-exp - 1), '0') + digits;
  } else if (size_t(exp) + 1 >= digits.size()) {
    out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
  }
  return sign + out;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    const char32_t c = uni::next(s, i);
    if (c == char32_t(q) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (!uni::is_printable(c)) {
      char b[16];
      if (c < 0x100)
        std::snprintf(b, sizeof b, "\\x%02x", unsigned(c));
      else if (c < 0x10000)
        std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
      else
        std::snprintf(b, sizeof b, "\\U%08x", unsigned(c));
      out += b;
    } else {
      uni::append(out, c);
    }
  }
  out += q;
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value escape(const Value& v) {
  if (v.is_markup()) return v;
  return Value::markup(html_escape(py_str(v)));
}

namespace {

std::string seq_repr(const Value& v) {
  const List& items = v.items();
  std::string out = v.is_tuple() ? "(" : "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += py_repr(items[i]);
  }
  if (v.is_tuple() && items.size() == 1) out += ",";
  out += v.is_tuple() ? ")" : "]";
  return out;
}

std::string dict_repr(const Dict& d) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, val] : d.entries) {
    if (!first) out += ", ";
    first = false;
    out += py_repr(k) + ": " + py_repr(val);
  }
  return out + "}";
}

}  // namespace

std::string py_repr(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return "Undefined";
    case Value::Type::String: return v.is_markup() ? "Markup(" + string_repr(v.str()) + ")" : string_repr(v.str());
    case Value::Type::List: return seq_repr(v);
    case Value::Type::Dict: return dict_repr(v.dict());
    default: return py_str(v);
  }
}

std::string py_str(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return "";
    case Value::Type::None: return "None";
    case Value::Type::Bool: return v.as_bool() ? "True" : "False";
    case Value::Type::Int: return std::to_string(v.as_int());
    case Value::Type::Float: return float_repr(v.as_float());
    case Value::Type::String: return v.str();
    case Value::Type::List: return seq_repr(v);
    case Value::Type::Dict: return dict_repr(v.dict());
    case Value::Type::Object: return v.object()->repr();
  }
  return "";
}

}  // namespace kvs::jinja
