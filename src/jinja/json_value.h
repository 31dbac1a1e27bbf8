// JSON in and out: request JSON (key order kept) becomes template values,
// and the tojson filter writes values as Python's json.dumps does (HF's
// tojson: ensure_ascii off by default, indent, separators, sort_keys).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "jinja/value.h"

namespace kvs::jinja {

Value from_json(const nlohmann::ordered_json& j);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;             // json.dumps' indent as its string; nullopt = one line
  std::optional<std::string> item_sep, key_sep;  // separators; defaults depend on indent
  bool sort_keys = false;
};

// json.dumps(v, ...); TypeError for values JSON has no form for
// (undefined, namespaces, generators, callables).
std::string json_dumps(const Value& v, const JsonDumpOptions& opt);

}  // namespace kvs::jinja
