#include "server/responses_codec.h"

#include <algorithm>

namespace kvs::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

enum class Use { Chat, Own, Metadata, Unsupported };
struct Field {
  const char* name;
  Use use;
  const char* why;
};
const Field kFields[] = {
    {"model", Use::Chat, ""},
    {"input", Use::Own, ""},
    {"instructions", Use::Own, ""},
    {"max_output_tokens", Use::Own, ""},
    {"temperature", Use::Chat, ""},
    {"top_p", Use::Chat, ""},
    {"stream", Use::Chat, ""},
    {"seed", Use::Chat, ""},
    {"previous_response_id", Use::Own, ""},
    {"store", Use::Own, ""},
    {"text", Use::Own, ""},
    {"metadata", Use::Metadata, ""},
    {"user", Use::Metadata, ""},
    {"service_tier", Use::Metadata, ""},
    {"prompt_cache_key", Use::Metadata, ""},
    {"safety_identifier", Use::Metadata, ""},
    {"stream_options", Use::Metadata, ""},
    {"tools", Use::Own, ""},
    {"tool_choice", Use::Own, ""},
    {"parallel_tool_calls", Use::Own, ""},
    {"max_tool_calls", Use::Unsupported, "a cap on tool calls is not supported (parallel_tool_calls false gives one)"},
    {"reasoning", Use::Unsupported, "reasoning options are not supported for these models"},
    {"include", Use::Unsupported, "extra output items are not supported"},
    {"truncation", Use::Unsupported, "only truncation \"disabled\" is supported"},
    {"background", Use::Unsupported, "background responses are not supported"},
    {"prompt", Use::Unsupported, "prompt templates are not supported"},
    {"top_logprobs", Use::Unsupported, "logprobs are not supported on /v1/responses"},
    {"conversation", Use::Unsupported, "conversation objects are not supported; use previous_response_id"},
};

bool trivial(const std::string& k, const json& v) {
  if (k == "include") return v.is_array() && v.empty();
  if (k == "truncation") return v == "disabled";
  if (k == "background") return v == false;
  return false;
}

void check_fields(const ojson& b) {
  for (const auto& [k, v] : b.items()) {
    const Field* f = std::find_if(std::begin(kFields), std::end(kFields), [&](const Field& x) { return k == x.name; });
    if (f == std::end(kFields))
      throw bad_request("unknown field '" + k + "' for /v1/responses (docs/SERVER.md lists the fields kvserve takes)", k);
    if (f->use == Use::Unsupported && !v.is_null() && !trivial(k, json::parse(v.dump())))
      throw bad_request("'" + k + "': " + f->why, k);
  }
}

std::string content_text(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request(where + ".content must be a string or an array of text parts", "input");
  std::string s;
  for (const auto& p : c) {
    const std::string t = p.is_object() && p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>() : "";
    if ((t != "input_text" && t != "output_text" && t != "text") || !p.contains("text") || !p["text"].is_string())
      throw bad_request(where + ": only text parts (input_text, output_text) are supported", "input");
    if (&p != &c.front()) s += '\n';  // as chat joins text parts
    s += p["text"].get<std::string>();
  }
  return s;
}

std::string item_string(const ojson& it, const char* k, const std::string& where) {
  if (!it.contains(k) || !it[k].is_string()) throw bad_request(where + " needs a string '" + k + "'", "input");
  return it[k].get<std::string>();
}

// Input items as chat messages: messages by role, function_call items as
// the tool_calls of one assistant turn (consecutive calls share it), and
// function_call_output items as tool messages.
ojson input_messages(const ojson& in) {
  if (in.is_string()) return ojson::array({{{"role", "user"}, {"content", in.get<std::string>()}}});
  if (!in.is_array() || in.empty()) throw bad_request("'input' must be a string or a non-empty array of items", "input");
  ojson out = ojson::array();
  for (size_t i = 0; i < in.size(); ++i) {
    const ojson& it = in[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!it.is_object()) throw bad_request(where + " must be an object", "input");
    const std::string type = it.contains("type") && it["type"].is_string() ? it["type"].get<std::string>() : "message";
    if (type == "function_call") {
      const ojson call = {{"id", item_string(it, "call_id", where)},
                          {"type", "function"},
                          {"function", {{"name", item_string(it, "name", where)},
                                        {"arguments", item_string(it, "arguments", where)}}}};
      if (out.empty() || out.back()["role"] != "assistant" || !out.back().contains("tool_calls"))
        out.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array()}});
      out.back()["tool_calls"].push_back(call);
      continue;
    }
    if (type == "function_call_output") {
      out.push_back({{"role", "tool"}, {"tool_call_id", item_string(it, "call_id", where)},
                     {"content", item_string(it, "output", where)}});
      continue;
    }
    if (type != "message")
      throw bad_request(where + ": items of type '" + type +
                            "' are not supported (messages, function_call and function_call_output are)",
                        "input");
    if (!it.contains("role") || !it["role"].is_string()) throw bad_request(where + " needs a string 'role'", "input");
    std::string role = it["role"];
    if (role == "developer") role = "system";
    if (role != "user" && role != "assistant" && role != "system")
      throw bad_request(where + ".role must be user, assistant, system or developer", "input");
    out.push_back({{"role", role}, {"content", content_text(it.contains("content") ? it["content"] : ojson(""), where)}});
  }
  return out;
}

// Responses' function tools ({"type": "function", "name", ...}) in chat's
// shape, and its tool_choice.
ojson chat_tools(const ojson& tools) {
  if (!tools.is_array()) throw bad_request("'tools' must be an array", "tools");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || t["type"] != "function")
      throw bad_request(where + ": only function tools are supported (built-in tools are not)", "tools");
    ojson fn = ojson::object();
    for (const auto& [k, v] : t.items()) {
      if (k == "type") continue;
      if (k != "name" && k != "description" && k != "parameters" && k != "strict")
        throw bad_request(where + "." + k + " is not a known field", "tools");
      fn[k] = v;
    }
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

ojson chat_tool_choice(const ojson& c) {
  if (c.is_object() && c.contains("type") && c["type"] == "function" && c.contains("name"))
    return {{"type", "function"}, {"function", {{"name", c["name"]}}}};
  return c;  // strings as they are; anything else is refused by the chat parser
}

// Responses' text.format to chat's response_format.
ojson response_format(const ojson& text) {
  if (!text.is_object()) throw bad_request("'text' must be an object", "text");
  if (!text.contains("format") || text["format"].is_null()) return ojson();
  const ojson& f = text["format"];
  if (!f.is_object() || !f.contains("type")) throw bad_request("'text.format' must be an object with a 'type'", "text");
  if (f["type"] != "json_schema") return f;
  for (const auto& [k, v] : f.items())
    if (k != "type" && k != "name" && k != "schema" && k != "strict" && k != "description")
      throw bad_request("unknown field 'text.format." + k + "'", "text");
  ojson js = ojson::object();
  for (const char* k : {"name", "schema", "strict", "description"})
    if (f.contains(k)) js[k] = f[k];
  return ojson{{"type", "json_schema"}, {"json_schema", js}};
}

}  // namespace

std::string previous_response_id(const std::string& body) {
  try {
    const json j = json::parse(body);
    if (j.is_object() && j.contains("previous_response_id") && j["previous_response_id"].is_string())
      return j["previous_response_id"];
  } catch (const json::exception&) {
  }
  return "";
}

ParsedRequest parse_responses(const std::string& body, ResponsesRequest& out, const ojson& history) {
  ojson b;
  try {
    b = ojson::parse(body);
  } catch (const ojson::exception&) {
    throw bad_request("the request body is not valid JSON");
  }
  if (!b.is_object()) throw bad_request("request body must be a JSON object");
  check_fields(b);
  if (!b.contains("input") || b["input"].is_null()) throw bad_request("'input' is required", "input");
  if (b.contains("instructions") && !b["instructions"].is_null()) {
    if (!b["instructions"].is_string()) throw bad_request("'instructions' must be a string", "instructions");
    out.instructions = b["instructions"];
  }
  if (b.contains("previous_response_id") && !b["previous_response_id"].is_null()) {
    if (!b["previous_response_id"].is_string()) throw bad_request("'previous_response_id' must be a string", "previous_response_id");
    out.previous_response_id = b["previous_response_id"];
  }
  if (b.contains("store") && !b["store"].is_null()) {
    if (!b["store"].is_boolean()) throw bad_request("'store' must be true or false", "store");
    out.store = b["store"];
  }
  out.input = input_messages(b["input"]);
  ojson chat = ojson::object();
  for (const char* k : {"model", "temperature", "top_p", "stream", "seed"})
    if (b.contains(k)) chat[k] = b[k];
  if (b.contains("max_output_tokens")) chat["max_tokens"] = b["max_output_tokens"];
  if (b.contains("text") && !b["text"].is_null()) {
    const ojson rf = response_format(b["text"]);
    if (!rf.is_null()) chat["response_format"] = rf;
  }
  if (b.contains("tools") && !b["tools"].is_null()) chat["tools"] = chat_tools(b["tools"]);
  if (b.contains("tool_choice") && !b["tool_choice"].is_null()) chat["tool_choice"] = chat_tool_choice(b["tool_choice"]);
  if (b.contains("parallel_tool_calls")) chat["parallel_tool_calls"] = b["parallel_tool_calls"];
  ojson msgs = ojson::array();
  if (!out.instructions.empty()) msgs.push_back({{"role", "system"}, {"content", out.instructions}});
  for (const ojson* v : {&history, static_cast<const ojson*>(&out.input)})
    for (const ojson& m : *v) msgs.push_back(m);
  chat["messages"] = msgs;
  for (const char* k : {"temperature", "top_p", "max_output_tokens", "text", "metadata", "tools", "tool_choice",
                        "parallel_tool_calls"})
    if (b.contains(k)) out.params[k] = json::parse(b[k].dump());
  try {
    ParsedRequest p = parse_request(Endpoint::Chat, chat.dump());
    p.endpoint = Endpoint::Responses;
    return p;
  } catch (ApiError e) {
    if (e.param == "max_tokens") e.param = "max_output_tokens";
    else if (e.param.rfind("messages", 0) == 0) e.param = "input";
    else if (e.param.rfind("response_format", 0) == 0) e.param = "text";
    throw e;
  }
}

namespace {

std::string suffix(const std::string& id) { return id.substr(std::min<size_t>(5, id.size())); }

json call_item(const ResponseMeta& meta, const ToolCall& c, size_t k, bool done) {
  return {{"type", "function_call"},
          {"id", "fc_" + suffix(meta.id) + "_" + std::to_string(k)},
          {"call_id", c.id},
          {"name", c.name},
          {"arguments", done ? c.arguments : ""},
          {"status", done ? "completed" : "in_progress"}};
}

}  // namespace

ojson assistant_turn(const std::string& text, const std::vector<ToolCall>& calls) {
  ojson m = {{"role", "assistant"}, {"content", text}};
  if (calls.empty()) return m;
  m["tool_calls"] = ojson::array();
  for (const ToolCall& c : calls)
    m["tool_calls"].push_back(
        {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return m;
}

json response_object(const ResponseMeta& meta, const ResponsesRequest& rq, const std::string& text,
                     const std::vector<ToolCall>& calls, sched::FinishReason finish, const sched::Usage& usage,
                     bool done) {
  const bool length = finish == sched::FinishReason::Length;
  json out = {{"id", meta.id},
              {"object", "response"},
              {"created_at", meta.created},
              {"model", meta.model},
              {"status", !done ? "in_progress" : length ? "incomplete" : "completed"},
              {"error", nullptr},
              {"incomplete_details", done && length ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
              {"instructions", rq.instructions.empty() ? json(nullptr) : json(rq.instructions)},
              {"previous_response_id", rq.previous_response_id.empty() ? json(nullptr) : json(rq.previous_response_id)},
              {"max_output_tokens", rq.params.value("max_output_tokens", json(nullptr))},
              {"temperature", rq.params.value("temperature", json(1.0))},
              {"top_p", rq.params.value("top_p", json(1.0))},
              {"text", rq.params.value("text", json{{"format", {{"type", "text"}}}})},
              {"metadata", rq.params.value("metadata", json::object())},
              {"parallel_tool_calls", rq.params.value("parallel_tool_calls", json(true))},
              {"tool_choice", rq.params.value("tool_choice", json("auto"))},
              {"tools", rq.params.value("tools", json::array())},
              {"store", rq.store}};
  json items = json::array();
  if (done) {
    items.push_back({{"type", "message"},
                     {"id", "msg_" + meta.id.substr(std::min<size_t>(5, meta.id.size()))},
                     {"status", length ? "incomplete" : "completed"},
                     {"role", "assistant"},
                     {"content", json::array({{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}})}});
    for (size_t k = 0; k < calls.size(); ++k) items.push_back(call_item(meta, calls[k], k, true));
    out["usage"] = {{"input_tokens", usage.prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
                    {"output_tokens", usage.completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", 0}}},
                    {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  } else {
    out["usage"] = nullptr;
  }
  out["output"] = std::move(items);
  return out;
}

ResponsesEvents::ResponsesEvents(ResponseMeta meta, ResponsesRequest rq) : meta_(std::move(meta)), rq_(std::move(rq)) {
  item_id_ = "msg_" + meta_.id.substr(std::min<size_t>(5, meta_.id.size()));
}

std::string ResponsesEvents::event(json e) {
  e["sequence_number"] = seq_++;
  return "event: " + e["type"].get<std::string>() + "\ndata: " + dump(e) + "\n\n";
}

// Events are numbered in the order they are built: one statement each (the
// operands of a + b are evaluated in no fixed order).
std::string ResponsesEvents::start() {
  const json r = response_object(meta_, rq_, "", {}, sched::FinishReason::None, {}, false);
  const json item = {{"type", "message"}, {"id", item_id_}, {"status", "in_progress"}, {"role", "assistant"},
                     {"content", json::array()}};
  std::string out = event({{"type", "response.created"}, {"response", r}});
  out += event({{"type", "response.in_progress"}, {"response", r}});
  out += event({{"type", "response.output_item.added"}, {"output_index", 0}, {"item", item}});
  out += event({{"type", "response.content_part.added"}, {"item_id", item_id_}, {"output_index", 0},
                {"content_index", 0}, {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  return out;
}

std::string ResponsesEvents::delta(const std::string& text) {
  if (text.empty()) return "";
  text_ += text;
  return event({{"type", "response.output_text.delta"}, {"item_id", item_id_}, {"output_index", 0},
                {"content_index", 0}, {"delta", text}, {"logprobs", json::array()}});
}

std::string ResponsesEvents::finish(sched::FinishReason finish, const sched::Usage& usage,
                                    const std::vector<ToolCall>& calls) {
  const json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}};
  const json r = response_object(meta_, rq_, text_, calls, finish, usage);
  const bool length = finish == sched::FinishReason::Length;
  std::string out = event({{"type", "response.output_text.done"}, {"item_id", item_id_}, {"output_index", 0},
                           {"content_index", 0}, {"text", text_}, {"logprobs", json::array()}});
  out += event({{"type", "response.content_part.done"}, {"item_id", item_id_}, {"output_index", 0}, {"content_index", 0},
                {"part", part}});
  out += event({{"type", "response.output_item.done"}, {"output_index", 0}, {"item", r["output"][0]}});
  for (size_t k = 0; k < calls.size(); ++k) {
    // A call comes out of the parser whole: its arguments in one delta.
    const json item = r["output"][k + 1];
    const size_t at = k + 1;
    out += event({{"type", "response.output_item.added"}, {"output_index", at}, {"item", call_item(meta_, calls[k], k, false)}});
    out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", item["id"]}, {"output_index", at},
                  {"delta", calls[k].arguments}});
    out += event({{"type", "response.function_call_arguments.done"}, {"item_id", item["id"]}, {"output_index", at},
                  {"arguments", calls[k].arguments}});
    out += event({{"type", "response.output_item.done"}, {"output_index", at}, {"item", item}});
  }
  out += event({{"type", length ? "response.incomplete" : "response.completed"}, {"response", r}});
  return out;
}

}  // namespace kvs::server
