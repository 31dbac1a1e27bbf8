// What a chat request asks about tools (OpenAI's `tools`, `tool_choice`,
// `parallel_tool_calls`), checked, and the grammar that makes a call certain
// when the choice is `required` or a named function: the call in the format
// the chat template teaches (tool_calls.h), with each tool's arguments
// constrained to its `parameters` schema.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "server/tool_calls.h"

namespace kvs::server {

struct ToolRequest {
  enum class Choice { None, Auto, Required, Named };
  // The definitions as sent: [{"type": "function", "function": {"name",
  // "description"?, "parameters"?, "strict"?}}]; empty when none.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  Choice choice = Choice::None;  // OpenAI: auto when tools are given, else none
  std::string name;              // Choice::Named: the function
  bool parallel = true;          // parallel_tool_calls
  // Whether calls are looked for in the reply (and tools reach the template).
  bool active() const { return choice != Choice::None && !tools.empty(); }
  bool forced() const { return choice == Choice::Required || choice == Choice::Named; }
};

// Reads tools / tool_choice / parallel_tool_calls of a chat body; throws
// ApiError 400 naming the field (a tool without a name, a duplicate name, a
// named choice that is not among the tools, tool_choice without tools).
ToolRequest parse_tool_request(const nlohmann::ordered_json& body);

// GBNF for a forced choice: one call (or, with parallel, one or more) of the
// allowed tools, in format `f`. Throws ApiError 400: a format kvserve cannot
// force, or a parameters schema outside the supported subset (naming the
// keyword and the tool).
std::string forced_tool_gbnf(ToolFormat f, const ToolRequest& t);

// An assistant message's tool_calls with each function.arguments string that
// holds a JSON object parsed into that object, as vLLM hands them to a chat
// template (Llama 3.x's writes `arguments | tojson`).
nlohmann::ordered_json template_messages(const nlohmann::ordered_json& messages);

}  // namespace kvs::server
