#include "grammar/json_schema.h"

#include <cctype>
#include <map>
#include <set>

#include "grammar/grammar.h"

namespace kvs::grammar {

using json = nlohmann::ordered_json;

namespace {

// Shared by every schema: JSON's lexical pieces.
const char* kCommon = R"(ws ::= | " " | "\n" [ \t]{0,20}
json-char ::= [^"\\\x00-\x1F\x7F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\""
json-int ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-number ::= json-int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
json-bool ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}"
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
)";

// A GBNF literal for the exact bytes of `s`.
std::string lit(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c == '\n') {
      o += "\\n";
    } else if (c == '\r') {
      o += "\\r";
    } else if (c == '\t') {
      o += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      static const char* h = "0123456789ABCDEF";
      o += "\\x";
      o += h[c >> 4];
      o += h[c & 15];
    } else {
      o += char(c);
    }
  }
  return o + "\"";
}

class Compiler {
 public:
  Compiler(const json& root, std::string prefix) : root_(root), prefix_(std::move(prefix)) {}
  // The schema's own rules (not the common ones); `top` gets the symbol
  // that matches a value of the schema.
  std::string run(std::string& top) {
    top = rule_for(root_, "#");
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  const json& root_;
  const std::string prefix_;
  std::map<std::string, std::string> rules_;  // name -> body
  std::map<std::string, std::string> refs_;   // $ref -> rule name
  int next_ = 0;
  int depth_ = 0;  // schemas inside schemas, on the way down
  // Deeper schemas are refused: the compiler recurses per level (on a
  // server I/O thread) and each level's location names every level above.
  static constexpr int kMaxDepth = 64;
  struct Nest {
    int& d;
    explicit Nest(int& depth) : d(++depth) {}
    ~Nest() { --d; }
  };

  [[noreturn]] static void fail(const std::string& where, const std::string& what) {
    throw GrammarError("json schema at " + where + ": " + what);
  }
  std::string fresh(const std::string& hint) {
    std::string h;
    for (char c : hint) h += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
    if (h.size() > 24) h.resize(24);
    return prefix_ + "s" + std::to_string(next_++) + (h.empty() ? "" : "-" + h);
  }
  std::string define(const std::string& hint, const std::string& body) {
    const std::string n = fresh(hint);
    rules_[n] = body;
    return n;
  }

  const json& resolve(const std::string& ref, const std::string& where) const {
    if (ref == "#") return root_;
    for (const char* p : {"#/$defs/", "#/definitions/"}) {
      const std::string pre = p;
      if (ref.rfind(pre, 0) != 0) continue;
      const std::string key = pre == "#/$defs/" ? "$defs" : "definitions";
      const std::string name = ref.substr(pre.size());
      if (root_.contains(key) && root_[key].is_object() && root_[key].contains(name)) return root_[key][name];
      fail(where, "$ref '" + ref + "' names no definition");
    }
    fail(where, "$ref '" + ref + "' is not a local reference into $defs or definitions");
  }

  std::string rule_for(const json& s, const std::string& where);
  std::string typed(const std::string& type, const json& s, const std::string& where);
  std::string object_rule(const json& s, const std::string& where);
  std::string array_rule(const json& s, const std::string& where);
  std::string string_rule(const json& s, const std::string& where);
  void check_keywords(const json& s, const std::string& where) const;
};

void Compiler::check_keywords(const json& s, const std::string& where) const {
  static const std::set<std::string> known = {
      "type",     "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
      "minLength", "maxLength", "enum",     "const",                "anyOf", "$ref",     "$defs",
      "definitions", "title",  "description", "$schema",           "$id",   "$comment", "examples",
      "default",  "strict"};
  for (const auto& [k, v] : s.items())
    if (!known.count(k)) fail(where, "the keyword '" + k + "' is not supported (kvserve constrains to OpenAI's strict-mode subset)");
}

std::string Compiler::rule_for(const json& s, const std::string& where) {
  if (depth_ >= kMaxDepth)
    fail(where.substr(0, 80) + "...", "schemas nest more than " + std::to_string(kMaxDepth) +
                                          " levels deep; flatten the schema or name parts in $defs");
  const Nest nest(depth_);
  if (s.is_boolean()) {
    if (!s.get<bool>()) fail(where, "the schema 'false' matches nothing");
    return "json-value";
  }
  if (!s.is_object()) fail(where, "a schema must be an object");
  check_keywords(s, where);
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) fail(where, "'$ref' must be a string");
    const std::string ref = s["$ref"];
    auto it = refs_.find(ref);
    if (it != refs_.end()) return it->second;
    const std::string name = fresh("ref");
    refs_[ref] = name;  // before compiling: a recursive schema refers back to it
    rules_[name] = rule_for(resolve(ref, where), ref);
    return name;
  }
  if (s.contains("const")) return lit(s["const"].dump());
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty()) fail(where, "'enum' must be a non-empty array");
    std::string alts;
    for (const json& v : s["enum"]) alts += (alts.empty() ? "" : " | ") + lit(v.dump());
    return define("enum", alts);
  }
  if (s.contains("anyOf")) {
    if (!s["anyOf"].is_array() || s["anyOf"].empty()) fail(where, "'anyOf' must be a non-empty array");
    std::string alts;
    for (size_t i = 0; i < s["anyOf"].size(); ++i)
      alts += (alts.empty() ? "" : " | ") + rule_for(s["anyOf"][i], where + "/anyOf/" + std::to_string(i));
    return define("anyof", alts);
  }
  if (!s.contains("type")) {
    if (s.contains("properties")) return typed("object", s, where);
    return "json-value";  // {} (or annotations only): any JSON value
  }
  const json& t = s["type"];
  if (t.is_string()) return typed(t.get<std::string>(), s, where);
  if (!t.is_array() || t.empty()) fail(where, "'type' must be a string or a non-empty array of strings");
  std::string alts;
  for (const json& x : t) {
    if (!x.is_string()) fail(where, "'type' must list strings");
    alts += (alts.empty() ? "" : " | ") + typed(x.get<std::string>(), s, where);
  }
  return define("types", alts);
}

std::string Compiler::typed(const std::string& type, const json& s, const std::string& where) {
  if (type == "object") return object_rule(s, where);
  if (type == "array") return array_rule(s, where);
  if (type == "string") return string_rule(s, where);
  if (type == "number") return "json-number";
  if (type == "integer") return "json-int";
  if (type == "boolean") return "json-bool";
  if (type == "null") return "json-null";
  fail(where, "unknown type '" + type + "'");
}

// Properties in the schema's order; the optional ones may be left out, so
// first_i (nothing emitted yet) and rest_i (a comma before the next) for
// each suffix i.. of the property list.
std::string Compiler::object_rule(const json& s, const std::string& where) {
  if (s.contains("additionalProperties") && !(s["additionalProperties"].is_boolean() && !s["additionalProperties"].get<bool>()))
    fail(where, "'additionalProperties' other than false is not supported");
  if (!s.contains("properties")) return "json-object";
  const json& props = s["properties"];
  if (!props.is_object()) fail(where, "'properties' must be an object");
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) fail(where, "'required' must be an array");
    for (const json& r : s["required"]) {
      if (!r.is_string() || !props.contains(r.get<std::string>()))
        fail(where, "'required' names a property that 'properties' does not have");
      required.insert(r.get<std::string>());
    }
  }
  std::vector<std::pair<std::string, bool>> kv;  // rule of `"key": value`, required
  for (const auto& [k, v] : props.items())
    kv.push_back({define("kv", lit(json(k).dump()) + " ws \":\" ws " + rule_for(v, where + "/properties/" + k)),
                  required.count(k) > 0});
  const size_t n = kv.size();
  std::vector<std::string> first(n + 1), rest(n + 1);
  first[n] = define("first", "");
  rest[n] = define("rest", "");
  for (size_t i = n; i-- > 0;) {
    rest[i] = define("rest", "\",\" ws " + kv[i].first + " ws " + rest[i + 1] + (kv[i].second ? "" : " | " + rest[i + 1]));
    first[i] = define("first", kv[i].first + " ws " + rest[i + 1] + (kv[i].second ? "" : " | " + first[i + 1]));
  }
  return define("object", "\"{\" ws " + first[0] + " \"}\"");
}

std::string Compiler::array_rule(const json& s, const std::string& where) {
  const std::string item = s.contains("items") ? rule_for(s["items"], where + "/items") : "json-value";
  auto bound = [&](const char* k, int64_t dflt) {
    if (!s.contains(k)) return dflt;
    if (!s[k].is_number_unsigned() || s[k].get<int64_t>() > 1000) fail(where, std::string("'") + k + "' must be 0..1000");
    return s[k].get<int64_t>();
  };
  const int64_t lo = bound("minItems", 0), hi = bound("maxItems", -1);
  if (hi >= 0 && hi < lo) fail(where, "'maxItems' is below 'minItems'");
  const std::string more = "\",\" ws " + item + " ws";
  std::string body;
  if (hi == 0) {
    body = "\"[\" ws \"]\"";
  } else {
    // The first item, then lo-1 required and the rest optional (or open).
    std::string reps = lo > 1 ? "(" + more + "){" + std::to_string(lo - 1) + "}" : "";
    const std::string tail = hi < 0 ? "(" + more + ")*" : hi - std::max<int64_t>(lo, 1) > 0 ? "(" + more + "){0," + std::to_string(hi - std::max<int64_t>(lo, 1)) + "}" : "";
    const std::string items = item + " ws " + reps + " " + tail;
    body = lo == 0 ? "\"[\" ws (" + items + ")? \"]\"" : "\"[\" ws " + items + " \"]\"";
  }
  return define("array", body);
}

std::string Compiler::string_rule(const json& s, const std::string& where) {
  if (!s.contains("minLength") && !s.contains("maxLength")) return "json-string";
  auto bound = [&](const char* k, int64_t dflt) {
    if (!s.contains(k)) return dflt;
    if (!s[k].is_number_unsigned() || s[k].get<int64_t>() > 4096) fail(where, std::string("'") + k + "' must be 0..4096");
    return s[k].get<int64_t>();
  };
  const int64_t lo = bound("minLength", 0), hi = bound("maxLength", -1);
  if (hi >= 0 && hi < lo) fail(where, "'maxLength' is below 'minLength'");
  const std::string rep = hi < 0 ? "{" + std::to_string(lo) + ",}" : "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
  return define("string", "\"\\\"\" json-char" + rep + " \"\\\"\"");
}

}  // namespace

std::string json_schema_gbnf(const json& schema) {
  std::string top;
  const std::string rules = Compiler(schema, "").run(top);
  return "root ::= ws " + top + " ws\n" + rules + kCommon;
}

std::string json_schema_rules(const json& schema, const std::string& prefix, std::string& top) {
  return Compiler(schema, prefix).run(top);
}

const char* json_common_gbnf() { return kCommon; }

std::string gbnf_literal(const std::string& bytes) { return lit(bytes); }

std::string json_object_gbnf() { return std::string("root ::= ws json-object ws\n") + kCommon; }

}  // namespace kvs::grammar
