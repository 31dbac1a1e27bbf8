#include "jinja/json_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "jinja/error.h"
#include "jinja/unicode.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

Value from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return Value::none();
    case T::boolean: return Value(j.get<bool>());
    case T::number_integer: return Value(j.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? Value(int64_t(u)) : Value(double(u));
    }
    case T::number_float: return Value(j.get<double>());
    case T::string: return Value(j.get<std::string>());
    case T::array: {
      List items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x));
      return Value::list(std::move(items));
    }
    case T::object: {
      Dict d;
      d.entries.reserve(j.size());
      for (const auto& [k, v] : j.items()) d.entries.emplace_back(Value(k), from_json(v));
      return Value::dict(std::move(d));
    }
    default: return Value::none();
  }
}

namespace {

void dump_string(std::string& out, const std::string& s, bool ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const char32_t c = uni::next(s, i);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char buf[16];
    if (c < 0x20 || (ascii && c > 0x7e)) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", unsigned(0xd800 | (v >> 10)), unsigned(0xdc00 | (v & 0x3ff)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      }
      out += buf;
    } else {
      uni::append(out, c);
    }
  }
  out += '"';
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

class Dumper {
 public:
  Dumper(const JsonDumpOptions& o) : o_(o) {
    item_sep_ = o.item_sep ? *o.item_sep : (o.indent ? "," : ", ");
    key_sep_ = o.key_sep ? *o.key_sep : ": ";
  }

  void value(std::string& out, const Value& v, int level) {
    if (level > 512) throw EvalError("RecursionError: maximum recursion depth exceeded while encoding a JSON object");
    switch (v.type()) {
      case Value::Type::None: out += "null"; return;
      case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Value::Type::Int: out += std::to_string(v.as_int()); return;
      case Value::Type::Float: out += float_json(v.as_float()); return;
      case Value::Type::String: dump_string(out, v.str(), o_.ensure_ascii); return;
      case Value::Type::List: return list(out, v.items(), level);
      case Value::Type::Dict: return dict(out, v.dict(), level);
      default: type_error("Object of type " + type_name(v) + " is not JSON serializable");
    }
  }

 private:
  void newline(std::string& out, int level) {
    if (!o_.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *o_.indent;
  }

  void list(std::string& out, const List& items, int level) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep_;
      newline(out, level + 1);
      value(out, items[i], level + 1);
    }
    newline(out, level);
    out += ']';
  }

  std::string key_text(const Value& k) {
    switch (k.type()) {
      case Value::Type::String: return k.str();
      case Value::Type::Int: return std::to_string(k.as_int());
      case Value::Type::Float: return float_json(k.as_float());
      case Value::Type::Bool: return k.as_bool() ? "true" : "false";
      case Value::Type::None: return "null";
      default: type_error("keys must be str, int, float, bool or None, not " + type_name(k));
    }
  }

  void dict(std::string& out, const Dict& d, int level) {
    if (d.size() == 0) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> entries;
    for (const auto& e : d.entries) entries.push_back(&e);
    if (o_.sort_keys)
      std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return py_less(a->first, b->first); });
    out += '{';
    bool first = true;
    for (const auto* e : entries) {
      if (!first) out += item_sep_;
      first = false;
      newline(out, level + 1);
      dump_string(out, key_text(e->first), o_.ensure_ascii);
      out += key_sep_;
      value(out, e->second, level + 1);
    }
    newline(out, level);
    out += '}';
  }

  const JsonDumpOptions& o_;
  std::string item_sep_, key_sep_;
};

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  Dumper(opt).value(out, v, 0);
  return out;
}

}  // namespace kvs::jinja
