#include "server/tool_request.h"

#include <cctype>
#include <set>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "server/openai_codec.h"

namespace kvs::server {

using nlohmann::ordered_json;

namespace {

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

const ordered_json* member(const ordered_json& o, const char* k) {
  auto it = o.find(k);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

void check_tool(const ordered_json& t, size_t i, std::set<std::string>& names) {
  const std::string where = "tools[" + std::to_string(i) + "]";
  if (!t.is_object()) throw bad_request(where + " must be an object", "tools");
  const ordered_json* type = member(t, "type");
  if (!type || *type != "function")
    throw bad_request(where + ".type must be \"function\" (the only tool type chat completions serve)", "tools");
  const ordered_json* f = member(t, "function");
  if (!f || !f->is_object()) throw bad_request(where + ".function must be an object", "tools");
  for (const auto& [k, v] : f->items())
    if (k != "name" && k != "description" && k != "parameters" && k != "strict")
      throw bad_request(where + ".function." + k + " is not a known field", "tools");
  const ordered_json* name = member(*f, "name");
  if (!name || !name->is_string() || !valid_name(name->get<std::string>()))
    throw bad_request(where + ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _, - and .", "tools");
  if (!names.insert(name->get<std::string>()).second)
    throw bad_request(where + ": the name '" + name->get<std::string>() + "' is given twice", "tools");
  if (const ordered_json* d = member(*f, "description"); d && !d->is_string())
    throw bad_request(where + ".function.description must be a string", "tools");
  if (const ordered_json* p = member(*f, "parameters"); p && !p->is_object())
    throw bad_request(where + ".function.parameters must be a JSON schema object", "tools");
  if (const ordered_json* s = member(*f, "strict"); s && !s->is_boolean())
    throw bad_request(where + ".function.strict must be true or false", "tools");
}

void parse_choice(const ordered_json& c, ToolRequest& out, const std::set<std::string>& names) {
  if (c.is_string()) {
    const std::string s = c.get<std::string>();
    if (s == "none") out.choice = ToolRequest::Choice::None;
    else if (s == "auto") out.choice = ToolRequest::Choice::Auto;
    else if (s == "required") out.choice = ToolRequest::Choice::Required;
    else throw bad_request("'tool_choice' must be none, auto, required or {\"type\": \"function\", ...}", "tool_choice");
  } else if (c.is_object()) {
    const ordered_json* f = member(c, "function");
    const ordered_json* name = f && f->is_object() ? member(*f, "name") : nullptr;
    if (!member(c, "type") || c["type"] != "function" || !name || !name->is_string())
      throw bad_request("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        "tool_choice");
    out.choice = ToolRequest::Choice::Named;
    out.name = name->get<std::string>();
    if (!names.count(out.name))
      throw bad_request("'tool_choice' names the function '" + out.name + "', which is not among the tools",
                        "tool_choice");
  } else {
    throw bad_request("'tool_choice' must be a string or an object", "tool_choice");
  }
  if (out.forced() && out.tools.empty())
    throw bad_request("'tool_choice' asks for a call, but there are no 'tools'", "tool_choice");
}

std::string json_lit(const std::string& s) { return grammar::gbnf_literal(ordered_json(s).dump()); }

}  // namespace

ToolRequest parse_tool_request(const ordered_json& body) {
  ToolRequest out;
  std::set<std::string> names;
  if (const ordered_json* t = member(body, "tools")) {
    if (!t->is_array()) throw bad_request("'tools' must be an array", "tools");
    for (size_t i = 0; i < t->size(); ++i) check_tool((*t)[i], i, names);
    out.tools = *t;
  }
  out.choice = out.tools.empty() ? ToolRequest::Choice::None : ToolRequest::Choice::Auto;
  if (const ordered_json* c = member(body, "tool_choice")) parse_choice(*c, out, names);
  if (const ordered_json* p = member(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) throw bad_request("'parallel_tool_calls' must be true or false", "parallel_tool_calls");
    out.parallel = p->get<bool>();
  }
  return out;
}

std::string forced_tool_gbnf(ToolFormat f, const ToolRequest& t) {
  // Per allowed tool: its arguments' rules (prefixed, so tools never share a
  // name) and one alternative of `call`, the call's text in format f.
  std::string rules, alts;
  for (size_t i = 0; i < t.tools.size(); ++i) {
    const ordered_json& fn = t.tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (t.choice == ToolRequest::Choice::Named && name != t.name) continue;
    const ordered_json params = member(fn, "parameters") ? fn["parameters"] : ordered_json{{"type", "object"}};
    std::string top;
    try {
      rules += grammar::json_schema_rules(params, "t" + std::to_string(i) + "-", top);
    } catch (const grammar::GrammarError& e) {
      throw bad_request("tool '" + name + "' cannot be forced: its parameters " + std::string(e.what()), "tools");
    }
    std::string call;
    switch (f) {
      case ToolFormat::Hermes:
      case ToolFormat::Mistral:
      case ToolFormat::Granite:
        call = grammar::gbnf_literal("{\"name\": ") + " " + json_lit(name) + " " +
               grammar::gbnf_literal(", \"arguments\": ") + " " + top + " " + grammar::gbnf_literal("}");
        break;
      case ToolFormat::Llama3:
        call = grammar::gbnf_literal("{\"name\": ") + " " + json_lit(name) + " " +
               grammar::gbnf_literal(", \"parameters\": ") + " " + top + " " + grammar::gbnf_literal("}");
        break;
      case ToolFormat::Harmony:
        call = grammar::gbnf_literal("<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>") +
               " " + top;
        break;
      case ToolFormat::DeepSeek:
        call = grammar::gbnf_literal("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n") + " " + top +
               " " + grammar::gbnf_literal("\n```<｜tool▁call▁end｜>");
        break;
      case ToolFormat::Functionary:
        call = grammar::gbnf_literal("<function=" + name + ">") + " " + top + " " + grammar::gbnf_literal("</function>");
        break;
      case ToolFormat::None:
        throw bad_request("the chat template teaches no tool-call format, so a call cannot be forced", "tool_choice");
    }
    alts += (alts.empty() ? "" : " | ") + call;
  }
  // Formats that carry several calls at once repeat `call` when parallel
  // calls are allowed (the model ends the list); Llama 3.x and harmony take
  // one call per turn, and a named function is called once.
  const bool many = t.parallel && t.choice == ToolRequest::Choice::Required;
  auto list = [&](const std::string& first, const std::string& again) {
    return many ? first + " (" + again + ")*" : first;
  };
  std::string root;
  switch (f) {
    case ToolFormat::Hermes:
      root = list("\"<tool_call>\\n\" call \"\\n</tool_call>\"", "\"\\n<tool_call>\\n\" call \"\\n</tool_call>\"");
      break;
    case ToolFormat::Mistral: root = list("\"[TOOL_CALLS][\" call", "\", \" call") + " \"]\""; break;
    case ToolFormat::Granite: root = list("\"<|tool_call|>[\" call", "\", \" call") + " \"]\""; break;
    case ToolFormat::DeepSeek:
      root = grammar::gbnf_literal("<｜tool▁calls▁begin｜>") + " " + list("call", "call") + " " +
             grammar::gbnf_literal("<｜tool▁calls▁end｜>");
      break;
    default: root = "call"; break;
  }
  return "root ::= " + root + "\ncall ::= " + alts + "\n" + rules + grammar::json_common_gbnf();
}

ordered_json template_messages(const ordered_json& messages) {
  ordered_json out = messages;
  for (auto& m : out) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& tc : m["tool_calls"]) {
      if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
      ordered_json& fn = tc["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      const ordered_json parsed = ordered_json::parse(fn["arguments"].get<std::string>(), nullptr, false);
      if (parsed.is_object()) fn["arguments"] = parsed;
    }
  }
  return out;
}

}  // namespace kvs::server
