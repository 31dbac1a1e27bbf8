#include "jinja/pyformat.h"

#include <cmath>
#include <cstdio>

#include "jinja/error.h"
#include "jinja/str_ops.h"
#include "jinja/unicode.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

namespace {

[[noreturn]] void value_error(const std::string& m) { throw EvalError("ValueError: " + m); }

struct Spec {
  char fill = ' ', align = 0, sign = '-';
  bool alt = false, zero = false;
  int width = -1, precision = -1;
  char grouping = 0, type = 0;
};

std::string group_digits(const std::string& digits, char sep) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i && (n - i) % 3 == 0) out += sep;
    out += digits[i];
  }
  return out;
}

std::string align_text(std::string body, const Spec& s, char dflt_align, const std::string& sign = "") {
  const int64_t len = int64_t(uni::length(body) + sign.size());
  if (s.width < 0 || len >= s.width) return sign + body;
  const size_t pad = size_t(s.width - len);
  char align = s.align ? s.align : (s.zero ? '=' : dflt_align);
  const char fill = s.align ? s.fill : (s.zero ? '0' : ' ');
  if (align == '=') return sign + std::string(pad, fill) + body;
  if (align == '<') return sign + body + std::string(pad, fill);
  if (align == '>') return std::string(pad, fill) + sign + body;
  const size_t left = pad / 2;
  return std::string(left, fill) + sign + body + std::string(pad - left, fill);
}

std::string c_format(const char* conv, int precision, double d) {
  char fmt[16], buf[512];
  std::snprintf(fmt, sizeof fmt, "%%.%d%s", precision < 0 ? 6 : std::min(precision, 100), conv);
  std::snprintf(buf, sizeof buf, fmt, d);
  return buf;
}

std::string format_number(const Value& v, const Spec& s) {
  const char t = s.type;
  std::string sign, body;
  if (v.is_integral() && (t == 0 || t == 'd' || t == 'n' || t == 'x' || t == 'X' || t == 'o' || t == 'b' || t == 'c')) {
    int64_t x = v.as_int();
    if (t == 'c') return align_text(std::string(1, char(x)), s, '<');
    const bool neg = x < 0;
    uint64_t u = neg ? uint64_t(0) - uint64_t(x) : uint64_t(x);
    const int base = t == 'x' || t == 'X' ? 16 : t == 'o' ? 8 : t == 'b' ? 2 : 10;
    do {
      const int d = int(u % uint64_t(base));
      body.insert(body.begin(), char(d < 10 ? '0' + d : (t == 'X' ? 'A' : 'a') + d - 10));
      u /= uint64_t(base);
    } while (u);
    if (s.grouping) body = group_digits(body, s.grouping);
    if (s.alt && base != 10) body = std::string("0") + (t == 'X' ? 'X' : t) + body;
    sign = neg ? "-" : s.sign == '+' ? "+" : s.sign == ' ' ? " " : "";
    return align_text(body, s, '>', sign);
  }
  if (!v.is_number())
    value_error("Unknown format code '" + std::string(1, t ? t : 's') + "' for object of type '" + type_name(v) + "'");
  double d = v.as_float();
  const bool neg = std::signbit(d) && !std::isnan(d);
  d = std::fabs(d);
  if (t == 0 && s.precision < 0)
    body = float_repr(d);
  else if (t == 0)
    body = c_format("g", s.precision, d);
  else if (t == 'f' || t == 'F')
    body = c_format("f", s.precision, d);
  else if (t == 'e' || t == 'E')
    body = c_format(t == 'e' ? "e" : "E", s.precision, d);
  else if (t == 'g' || t == 'G')
    body = c_format(t == 'g' ? "g" : "G", s.precision, d);
  else if (t == '%')
    body = c_format("f", s.precision, d * 100) + "%";
  else
    value_error(std::string("Unknown format code '") + t + "' for object of type 'float'");
  if (s.grouping) {
    const size_t dot = body.find_first_not_of("0123456789");
    body = group_digits(body.substr(0, dot), s.grouping) + (dot == std::string::npos ? "" : body.substr(dot));
  }
  sign = neg ? "-" : s.sign == '+' ? "+" : s.sign == ' ' ? " " : "";
  return align_text(body, s, '>', sign);
}

Spec parse_spec(const std::string& spec) {
  Spec s;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) {
    s.fill = spec[0];
    s.align = spec[1];
    i = 2;
  } else if (!spec.empty() && is_align(spec[0])) {
    s.align = spec[0];
    i = 1;
  }
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) s.sign = spec[i++];
  if (i < spec.size() && spec[i] == '#') s.alt = true, ++i;
  if (i < spec.size() && spec[i] == '0') s.zero = true, ++i;
  auto number = [&]() {
    int n = -1;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) {
      n = (n < 0 ? 0 : n) * 10 + (spec[i++] - '0');
      if (n > 100000) value_error("Too many decimal digits in format string");
    }
    return n;
  };
  s.width = number();
  if (i < spec.size() && (spec[i] == ',' || spec[i] == '_')) s.grouping = spec[i++];
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    s.precision = number();
    if (s.precision < 0) value_error("Format specifier missing precision");
  }
  if (i < spec.size()) s.type = spec[i++];
  if (i != spec.size()) value_error("Invalid format specifier");
  return s;
}

std::string format_value(const Value& v, const std::string& spec_text) {
  const Spec s = parse_spec(spec_text);
  if (v.is_string() || (!v.is_number() && (s.type == 0 || s.type == 's'))) {
    if (s.type != 0 && s.type != 's')
      value_error(std::string("Unknown format code '") + s.type + "' for object of type 'str'");
    std::string body = v.is_string() ? v.str() : py_str(v);
    if (s.precision >= 0) body = pystr::cp_slice(body, 0, s.precision);
    return align_text(body, s, '<');
  }
  if (v.is_bool() && s.type == 0 && spec_text.empty()) return py_str(v);
  return format_number(v, s);
}

}  // namespace

std::string str_format(Ctx& ctx, const std::string& fmt, const Args& args, bool markup) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}')
        ++i;
      else
        value_error("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) value_error("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1), spec, conv;
    i = close;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field.resize(bang);
    }
    const size_t end = field.find_first_of(".[");
    const std::string head = field.substr(0, end);
    Value v;
    if (head.empty() || std::isdigit(static_cast<unsigned char>(head[0]))) {
      const size_t idx = head.empty() ? auto_index++ : size_t(std::stoul(head));
      if (idx >= args.pos.size())
        throw EvalError("IndexError: Replacement index " + std::to_string(idx) +
                        " out of range for positional args tuple");
      v = args.pos[idx];
    } else {
      bool found = false;
      for (const auto& [k, x] : args.kw)
        if (k == head) v = x, found = true;
      if (!found) throw EvalError("KeyError: '" + head + "'");
    }
    for (size_t p = end; p != std::string::npos && p < field.size();) {
      if (field[p] == '.') {
        const size_t q = field.find_first_of(".[", p + 1);
        v = get_attr(v, field.substr(p + 1, q - p - 1));
        p = q;
      } else {
        const size_t q = field.find(']', p);
        if (q == std::string::npos) value_error("Missing ']' in format string");
        const std::string key = field.substr(p + 1, q - p - 1);
        const bool digits = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
        v = get_item(v, digits ? Value(int64_t(std::stoll(key))) : Value(key));
        p = q + 1;
      }
    }
    if (conv == "r" || conv == "a")
      v = Value(py_repr(v));
    else if (conv == "s")
      v = Value(py_str(v));
    else if (!conv.empty())
      value_error("Unknown conversion specifier " + conv);
    std::string text = format_value(v, spec);
    if (markup && !v.is_markup()) text = html_escape(text);
    ctx.charge(text.size());
    out += text;
  }
  return out;
}

namespace {

struct Percent {
  std::string flags;
  int width = -1, precision = -1;
  char conv = 0;
};

std::string apply_percent(const Percent& p, const Value& v, bool markup) {
  const bool left = p.flags.find('-') != std::string::npos, zero = p.flags.find('0') != std::string::npos;
  std::string sign = p.flags.find('+') != std::string::npos ? "+" : p.flags.find(' ') != std::string::npos ? " " : "";
  std::string body;
  bool numeric = true;
  switch (p.conv) {
    case 's':
    case 'r':
    case 'a':
      body = p.conv == 's' ? py_str(v) : py_repr(v);
      if (p.precision >= 0) body = pystr::cp_slice(body, 0, p.precision);
      if (markup && !v.is_markup()) body = html_escape(body);
      numeric = false;
      sign.clear();
      break;
    case 'c':
      if (v.is_integral())
        uni::append(body, char32_t(v.as_int()));
      else if (v.is_string() && uni::length(v.str()) == 1)
        body = v.str();
      else
        type_error("%c requires int or char");
      numeric = false;
      sign.clear();
      break;
    default: {
      if (!v.is_number())
        type_error(std::string("%") + p.conv + " format: a real number is required, not " + type_name(v));
      const bool integer =
          p.conv == 'd' || p.conv == 'i' || p.conv == 'u' || p.conv == 'x' || p.conv == 'X' || p.conv == 'o';
      const double d = v.as_float();
      const bool neg = integer ? (v.is_integral() ? v.as_int() < 0 : d <= -1.0) : std::signbit(d) && !std::isnan(d);
      if (integer) {
        const int64_t x = v.is_integral() ? v.as_int() : int64_t(std::trunc(d));
        const uint64_t u = x < 0 ? uint64_t(0) - uint64_t(x) : uint64_t(x);
        char buf[32];
        std::snprintf(buf, sizeof buf,
                      p.conv == 'x'   ? "%llx"
                      : p.conv == 'X' ? "%llX"
                      : p.conv == 'o' ? "%llo"
                                      : "%llu",
                      (unsigned long long)u);
        body = buf;
        if (p.precision > int(body.size())) body.insert(0, size_t(p.precision) - body.size(), '0');
        if (p.flags.find('#') != std::string::npos && p.conv != 'd' && p.conv != 'i' && p.conv != 'u')
          body = std::string("0") + (p.conv == 'o' ? 'o' : p.conv) + body;
      } else {
        const char c[2] = {p.conv, 0};
        body = c_format(c, p.precision, std::fabs(d));
      }
      if (neg) sign = "-";
    }
  }
  const int64_t len = int64_t(uni::length(body) + sign.size());
  if (p.width > len) {
    const size_t pad = size_t(p.width - len);
    if (left) return sign + body + std::string(pad, ' ');
    if (zero && numeric) return sign + std::string(pad, '0') + body;
    return std::string(pad, ' ') + sign + body;
  }
  return sign + body;
}

}  // namespace

Value percent_format(Ctx& ctx, const Value& fmt_value, const Value& args) {
  const std::string& fmt = fmt_value.str();
  const bool markup = fmt_value.is_markup();
  List positional;
  const Dict* named = args.is_dict() ? &args.dict() : nullptr;
  if (args.is_tuple())
    positional = args.items();
  else if (!named)
    positional.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) value_error("incomplete format");
    Percent p;
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) value_error("incomplete format key");
      if (!named) type_error("format requires a mapping");
      arg = named->find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (!arg) throw EvalError("KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
      i = close + 1;
    }
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) p.flags += fmt[i++];
    auto number = [&]() {
      int n = -1;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        n = (n < 0 ? 0 : n) * 10 + (fmt[i++] - '0');
        if (n > 100000) value_error("width too big");
      }
      return n;
    };
    p.width = number();
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      p.precision = std::max(0, number());
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) value_error("incomplete format");
    p.conv = fmt[i];
    if (p.conv == '%') {
      out += '%';
      continue;
    }
    if (std::string("sradiuxXoeEfFgGc").find(p.conv) == std::string::npos)
      value_error(std::string("unsupported format character '") + p.conv + "'");
    if (!arg) {
      if (named && !args.is_tuple())
        arg = &args;
      else if (next < positional.size())
        arg = &positional[next++];
      else
        type_error("not enough arguments for format string");
    }
    std::string piece = apply_percent(p, *arg, markup);
    ctx.charge(piece.size());
    out += piece;
  }
  if (!named && next < positional.size()) type_error("not all arguments converted during string formatting");
  return markup ? Value::markup(std::move(out)) : Value(std::move(out));
}

}  // namespace kvs::jinja
