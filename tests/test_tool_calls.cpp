// Tool calls out of model-shaped text, per format: whole, streamed in every
// split (the same calls and content), content before a call released before
// the call completes, several calls, and malformed calls left as content.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "server/tool_calls.h"
#include "test_util.h"

using namespace kvs::server;
using nlohmann::json;

namespace {

ToolParse whole(ToolFormat f, const std::string& text) {
  ToolCallParser p(f, "call_");
  ToolParse a = p.push(text), b = p.finish();
  a.content += b.content;
  a.reasoning += b.reasoning;
  a.calls.insert(a.calls.end(), b.calls.begin(), b.calls.end());
  return a;
}

// Streamed in pieces of random sizes (1-byte pieces included).
ToolParse pieces(ToolFormat f, const std::string& text, unsigned seed) {
  std::mt19937 rng(seed);
  ToolCallParser p(f, "call_");
  ToolParse all;
  auto add = [&](const ToolParse& x) {
    all.content += x.content;
    all.reasoning += x.reasoning;
    all.calls.insert(all.calls.end(), x.calls.begin(), x.calls.end());
  };
  for (size_t i = 0; i < text.size();) {
    const size_t n = seed == 0 ? 1 : 1 + rng() % 7;
    add(p.push(text.substr(i, n)));
    i += n;
  }
  add(p.finish());
  return all;
}

void expect_same(const ToolParse& a, const ToolParse& b, const std::string& what) {
  EXPECT_EQ(a.content, b.content) << what;
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << what;
    EXPECT_EQ(json::parse(a.calls[i].arguments), json::parse(b.calls[i].arguments)) << what;
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << what;
  }
}

struct Case {
  ToolFormat f;
  std::string text;
  std::string content;
  std::vector<std::pair<std::string, json>> calls;
  std::string reasoning;
};

}  // namespace

TEST(ToolCalls, EveryFormatWholeAndStreamed) {
  const json paris = {{"city", "Paris"}, {"days", 2}};
  const std::vector<Case> cases = {
      {ToolFormat::Hermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
       "Let me check.\n", {{"get_weather", paris}}},
      {ToolFormat::Hermes,
       "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
       "<tool_call>{\"name\": \"now\", \"arguments\": \"{}\"}</tool_call>",
       "", {{"get_weather", paris}, {"now", json::object()}}},
      {ToolFormat::Llama3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}", "",
       {{"get_weather", paris}}},
      {ToolFormat::Llama3, "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}", "",
       {{"get_weather", paris}}},
      {ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}, \"id\": \"abc123xyz\"}]",
       "", {{"get_weather", paris}}},
      {ToolFormat::Mistral, "Sure. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 2}[TOOL_CALLS]now[ARGS]{}",
       "Sure. ", {{"get_weather", paris}, {"now", json::object()}}},
      {ToolFormat::DeepSeek,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```"
       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "", {{"get_weather", paris}}},
      {ToolFormat::Granite, "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}]", "",
       {{"get_weather", paris}}},
      {ToolFormat::Harmony,
       "<|channel|>analysis<|message|>The user wants weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
       "<|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": 2}",
       "", {{"get_weather", paris}}, "The user wants weather."},
      {ToolFormat::Harmony, "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.",
       "It is sunny.", {}, "Easy."},
      {ToolFormat::Functionary, "Checking.<function=get_weather>{\"city\": \"Paris\", \"days\": 2}</function>", "Checking.",
       {{"get_weather", paris}}},
      {ToolFormat::Functionary, "<function=>{}</function>", "<function=>{}</function>", {}},
      // Malformed: the text stays content, nothing is dropped.
      {ToolFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {broken</tool_call> ok",
       "<tool_call>{\"name\": \"f\", \"arguments\": {broken</tool_call> ok", {}},
      {ToolFormat::Hermes, "no call here, < tool_call > either", "no call here, < tool_call > either", {}},
      {ToolFormat::Llama3, "{not json at all", "{not json at all", {}},
  };
  for (const Case& c : cases) {
    const std::string what = std::string(to_string(c.f)) + ": " + c.text;
    const ToolParse w = whole(c.f, c.text);
    EXPECT_EQ(w.content, c.content) << what;
    EXPECT_EQ(w.reasoning, c.reasoning) << what;
    ASSERT_EQ(w.calls.size(), c.calls.size()) << what;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(w.calls[i].name, c.calls[i].first) << what;
      EXPECT_EQ(json::parse(w.calls[i].arguments), c.calls[i].second) << what;
      EXPECT_FALSE(w.calls[i].id.empty());
    }
    for (unsigned seed = 0; seed < 6; ++seed) expect_same(pieces(c.f, c.text, seed), w, what + " (split " + std::to_string(seed) + ")");
  }
}

// Content before a call leaves at once; the call comes only when complete.
TEST(ToolCalls, ContentIsNotHeldBackAndACallWaitsForItsEnd) {
  ToolCallParser p(ToolFormat::Hermes, "call_");
  EXPECT_EQ(p.push("I will look it up. <tool").content, "I will look it up. ");
  ToolParse mid = p.push("_call>{\"name\": \"f\", \"argu");
  EXPECT_TRUE(mid.content.empty());
  EXPECT_TRUE(mid.calls.empty());
  ToolParse end = p.push("ments\": {}}</tool_call>");
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_EQ(end.calls[0].name, "f");
  EXPECT_EQ(end.calls[0].id, "call_0");
  EXPECT_EQ(p.calls(), 1);
  // An open call at the end of generation that parses is a call.
  ToolCallParser q(ToolFormat::Hermes, "call_");
  q.push("<tool_call>{\"name\": \"g\", \"arguments\": {\"a\": 1}}");
  EXPECT_EQ(q.finish().calls.size(), 1u);
}

TEST(ToolCalls, FormatFromTheTemplate) {
  EXPECT_EQ(tool_format_of("{{ '<tool_call>' }}"), ToolFormat::Hermes);
  EXPECT_EQ(tool_format_of("[TOOL_CALLS]"), ToolFormat::Mistral);
  EXPECT_EQ(tool_format_of("<|channel|>commentary to=functions.x"), ToolFormat::Harmony);
  EXPECT_EQ(tool_format_of("<｜tool▁calls▁begin｜>"), ToolFormat::DeepSeek);
  EXPECT_EQ(tool_format_of("<|tool_call|>"), ToolFormat::Granite);
  EXPECT_EQ(tool_format_of("<|python_tag|>"), ToolFormat::Llama3);
  EXPECT_EQ(tool_format_of("{{ messages }}"), ToolFormat::None);
  EXPECT_EQ(tool_format_of("{{ '<function=' + name + '>' + args + '</function>' }}"), ToolFormat::Functionary);
}

// The templates people download: each is read in the format its text
// teaches (gpt-oss's writes "to=" and "functions." in separate pieces).
TEST(ToolCalls, FormatOfRealTemplates) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared is not available";
  auto text = [&](const std::string& name) {
    std::ifstream f(kvs::test::shared("chat-templates/" + name));
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  for (const auto& [name, f] : std::vector<std::pair<std::string, ToolFormat>>{
           {"openai-gpt-oss-120b.jinja", ToolFormat::Harmony},
           {"meetkai-functionary-medium-v3.1.jinja", ToolFormat::Functionary},
           {"Qwen-Qwen3-0.6B.jinja", ToolFormat::Hermes},
           {"Qwen3.5-4B.jinja", ToolFormat::Hermes},
           {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::Llama3},
           {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::Mistral},
           {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ToolFormat::DeepSeek}})
    EXPECT_EQ(tool_format_of(text(name)), f) << name << ": " << to_string(tool_format_of(text(name)));
}
