// Tool requests: tools / tool_choice / parallel_tool_calls checked with the
// field named; the forced-call grammar of every format accepts the call the
// format's parser reads back (and nothing else: other names, arguments
// outside the schema, a second call where one is allowed); tool-call
// arguments handed to templates as objects.
#include <gtest/gtest.h>

#include <memory>

#include "grammar/gbnf.h"
#include "grammar/matcher.h"
#include "server/openai_codec.h"
#include "server/tool_request.h"

using namespace kvs::server;
using kvs::grammar::Matcher;
using kvs::grammar::StackArena;
using nlohmann::ordered_json;

namespace {

ordered_json tool(const std::string& name, ordered_json params) {
  return {{"type", "function"}, {"function", {{"name", name}, {"parameters", std::move(params)}}}};
}

ordered_json weather_tools() {
  return ordered_json::array(
      {tool("get_weather", {{"type", "object"},
                            {"properties", {{"city", {{"type", "string"}}}, {"unit", {{"enum", {"c", "f"}}}}}},
                            {"required", {"city", "unit"}}}),
       tool("get_time", {{"type", "object"}, {"properties", {{"tz", {{"type", "string"}}}}}, {"required", {"tz"}}})});
}

ToolRequest request(ordered_json choice, bool parallel = true) {
  ordered_json body = {{"tools", weather_tools()}, {"tool_choice", std::move(choice)}, {"parallel_tool_calls", parallel}};
  return parse_tool_request(body);
}

std::string param_of(const ordered_json& body) {
  try {
    parse_tool_request(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param;
  }
  return "(accepted)";
}

bool matches(const std::string& gbnf, const std::string& text) {
  Matcher m(std::make_shared<StackArena>(std::make_shared<const kvs::grammar::Grammar>(kvs::grammar::parse_gbnf(gbnf))));
  return m.accept(text) && m.can_end();
}

// The calls the format's parser reads out of `text` (all of it at once).
std::vector<ToolCall> parsed(ToolFormat f, const std::string& text) {
  ToolCallParser p(f, "call_");
  ToolParse a = p.push(text), b = p.finish();
  a.calls.insert(a.calls.end(), b.calls.begin(), b.calls.end());
  return a.calls;
}

}  // namespace

TEST(ToolRequest, DefaultsAndChoices) {
  EXPECT_EQ(parse_tool_request(ordered_json::object()).choice, ToolRequest::Choice::None);
  const ToolRequest t = parse_tool_request({{"tools", weather_tools()}});
  EXPECT_EQ(t.choice, ToolRequest::Choice::Auto);
  EXPECT_TRUE(t.active());
  EXPECT_FALSE(t.forced());
  EXPECT_TRUE(t.parallel);
  EXPECT_FALSE(request("none").active());
  EXPECT_TRUE(request("required").forced());
  const ToolRequest named = request({{"type", "function"}, {"function", {{"name", "get_time"}}}}, false);
  EXPECT_EQ(named.choice, ToolRequest::Choice::Named);
  EXPECT_EQ(named.name, "get_time");
  EXPECT_FALSE(named.parallel);
}

TEST(ToolRequest, BadToolsNameTheField) {
  EXPECT_EQ(param_of({{"tools", "x"}}), "tools");
  EXPECT_EQ(param_of({{"tools", {{{"type", "function"}, {"name", "f"}}}}}), "tools");  // Responses' shape
  EXPECT_EQ(param_of({{"tools", {{{"type", "web_search"}}}}}), "tools");
  EXPECT_EQ(param_of({{"tools", {tool("has space", ordered_json::object())}}}), "tools");
  EXPECT_EQ(param_of({{"tools", {tool("f", ordered_json::object()), tool("f", ordered_json::object())}}}), "tools");
  EXPECT_EQ(param_of({{"tools", {tool("f", "not a schema")}}}), "tools");
  ordered_json extra = tool("f", ordered_json::object());
  extra["function"]["bogus"] = 1;
  EXPECT_EQ(param_of({{"tools", {extra}}}), "tools");
  EXPECT_EQ(param_of({{"tools", weather_tools()}, {"tool_choice", "sometimes"}}), "tool_choice");
  EXPECT_EQ(param_of({{"tools", weather_tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}),
            "tool_choice");
  EXPECT_EQ(param_of({{"tool_choice", "required"}}), "tool_choice");  // nothing to call
  EXPECT_EQ(param_of({{"tools", weather_tools()}, {"parallel_tool_calls", "yes"}}), "parallel_tool_calls");
  EXPECT_EQ(param_of({{"tool_choice", "none"}, {"parallel_tool_calls", false}}), "(accepted)");
}

TEST(ToolRequest, ForcedGrammarOfEveryFormatAcceptsWhatItsParserReads) {
  const std::string args = R"({"city": "Paris", "unit": "c"})";
  struct Case {
    ToolFormat f;
    std::string text;
  };
  const std::vector<Case> cases = {
      {ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>"},
      {ToolFormat::Llama3, "{\"name\": \"get_weather\", \"parameters\": " + args + "}"},
      {ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + args + "}]"},
      {ToolFormat::Granite, "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": " + args + "}]"},
      {ToolFormat::Harmony, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + args},
      {ToolFormat::DeepSeek, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" + args +
                                 "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
  };
  for (const Case& c : cases) {
    const std::string g = forced_tool_gbnf(c.f, request("required"));
    EXPECT_TRUE(matches(g, c.text)) << to_string(c.f) << "\n" << g;
    const std::vector<ToolCall> calls = parsed(c.f, c.text);
    ASSERT_EQ(calls.size(), 1u) << to_string(c.f);
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(ordered_json::parse(calls[0].arguments), ordered_json::parse(args)) << to_string(c.f);
    // Outside the schema: an unknown enum value, a missing required
    // argument, a function that does not exist.
    std::string bad_unit = c.text, no_unit = c.text, other = c.text;
    bad_unit.replace(bad_unit.find("\"c\""), 3, "\"k\"");
    no_unit.replace(no_unit.find(", \"unit\": \"c\""), 13, "");
    other.replace(other.find("get_weather"), 11, "get_wether");
    EXPECT_FALSE(matches(g, bad_unit)) << to_string(c.f);
    EXPECT_FALSE(matches(g, no_unit)) << to_string(c.f);
    EXPECT_FALSE(matches(g, other)) << to_string(c.f);
  }
}

TEST(ToolRequest, NamedChoiceIsOneCallOfThatFunction) {
  const ToolRequest named = request({{"type", "function"}, {"function", {{"name", "get_time"}}}});
  const std::string g = forced_tool_gbnf(ToolFormat::Hermes, named);
  const std::string call = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>";
  EXPECT_TRUE(matches(g, call));
  EXPECT_FALSE(matches(g, call + "\n" + call));
  EXPECT_FALSE(matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\", \"unit\": \"c\"}}\n</tool_call>"));
  // Required with parallel calls: one or more, any of the tools.
  const std::string gp = forced_tool_gbnf(ToolFormat::Hermes, request("required", true));
  EXPECT_TRUE(matches(gp, call + "\n" + call));
  EXPECT_FALSE(matches(forced_tool_gbnf(ToolFormat::Hermes, request("required", false)), call + "\n" + call));
  EXPECT_TRUE(matches(forced_tool_gbnf(ToolFormat::Mistral, request("required", true)),
                      "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"tz\": \"a\"}}, "
                      "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"b\"}}]"));
}

TEST(ToolRequest, ForcingNeedsAFormatAndASchemaInTheSubset) {
  EXPECT_THROW(forced_tool_gbnf(ToolFormat::None, request("required")), ApiError);
  ordered_json body = {{"tools", {tool("f", {{"type", "object"}, {"properties", {{"x", {{"type", "string"}, {"pattern", "a+"}}}}}})}},
                       {"tool_choice", "required"}};
  try {
    forced_tool_gbnf(ToolFormat::Hermes, parse_tool_request(body));
    FAIL() << "a keyword outside the subset must be refused";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools");
    EXPECT_NE(e.message.find("pattern"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("'f'"), std::string::npos) << e.message;
  }
  // A tool without parameters takes an empty object.
  ordered_json bare = {{"tools", {{{"type", "function"}, {"function", {{"name", "ping"}}}}}}, {"tool_choice", "required"}};
  EXPECT_TRUE(matches(forced_tool_gbnf(ToolFormat::Llama3, parse_tool_request(bare)),
                      "{\"name\": \"ping\", \"parameters\": {}}"));
}

TEST(ToolRequest, TemplatesGetArgumentsAsObjects) {
  const ordered_json msgs = ordered_json::array(
      {{{"role", "user"}, {"content", "hi"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls",
         {{{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{\"b\": 1, \"a\": 2}"}}}},
          {{"id", "call_2"}, {"type", "function"}, {"function", {{"name", "g"}, {"arguments", "not json"}}}}}}},
       {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "42"}}});
  const ordered_json out = template_messages(msgs);
  EXPECT_EQ(out[1]["tool_calls"][0]["function"]["arguments"].dump(), "{\"b\":1,\"a\":2}");  // the client's key order
  EXPECT_EQ(out[1]["tool_calls"][1]["function"]["arguments"], "not json");                 // left as sent
  EXPECT_EQ(out[2], msgs[2]);
}
