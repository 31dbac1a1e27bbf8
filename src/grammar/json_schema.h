// JSON schemas (OpenAI's structured outputs) to GBNF, so the sampler can
// only ever produce JSON that matches. The subset OpenAI documents for
// strict mode, plus the length and item bounds:
//   type: object (properties, required, additionalProperties false or
//         absent: only the listed properties), array (items, minItems,
//         maxItems), string (minLength, maxLength), number, integer,
//         boolean, null, and a list of types
//   enum, const, anyOf, $ref into $defs / definitions (or "#"), recursion
//   annotations: title, description, $schema, $id, $comment, examples, default
// Any other keyword (pattern, format, minimum, oneOf, allOf, ...) throws a
// GrammarError naming it. Properties come in the schema's order; optional
// ones may be left out. Whitespace between tokens is bounded, and so are a
// number's digits, so a constrained output always closes.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace kvs::grammar {

// Ordered: properties come out in the order the schema lists them.
std::string json_schema_gbnf(const nlohmann::ordered_json& schema);
// A schema's rules for a larger grammar (tool calls: one schema per tool
// inside a format's markers): every rule name starts with `prefix`, `top`
// gets the symbol matching a value of the schema, and the rules refer to the
// shared JSON rules of json_common_gbnf(), which the caller adds once.
std::string json_schema_rules(const nlohmann::ordered_json& schema, const std::string& prefix, std::string& top);
// ws, json-string, json-value, ... (what json_schema_rules' rules use).
const char* json_common_gbnf();
// A GBNF string literal matching exactly `bytes`.
std::string gbnf_literal(const std::string& bytes);
// Any JSON object (response_format json_object).
std::string json_object_gbnf();

}  // namespace kvs::grammar
