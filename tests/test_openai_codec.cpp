// The OpenAI codec without sockets or a model: request bodies in (prompt
// shapes, echo, priority, JSON errors), response objects and stream chunks
// out (indices, refusal, system_fingerprint).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/openai_codec.h"

using namespace kvs;
using namespace kvs::server;
using nlohmann::json;

namespace {

ParsedRequest cmpl(const json& body) { return parse_request(Endpoint::Completions, body.dump()); }

// The 400 a body gets (fails the test when it parses).
ApiError error_of(Endpoint ep, const std::string& body) {
  try {
    parse_request(ep, body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}
ApiError cmpl_error(const json& body) { return error_of(Endpoint::Completions, body.dump()); }

std::string token_text(int32_t id) { return "t" + std::to_string(id); }

}  // namespace

TEST(OpenAiCodec, PromptShapes) {
  {
    const ParsedRequest p = cmpl({{"prompt", "hello"}});
    ASSERT_EQ(p.prompts.size(), 1u);
    EXPECT_EQ(p.prompts[0].text, "hello");
    EXPECT_FALSE(p.prompts[0].ids);
  }
  {
    const ParsedRequest p = cmpl({{"prompt", {"a", "b", "c"}}, {"n", 2}});
    ASSERT_EQ(p.prompts.size(), 3u);
    EXPECT_EQ(p.prompts[2].text, "c");
    EXPECT_EQ(p.n, 2);
  }
  {
    const ParsedRequest p = cmpl({{"prompt", {1, 5, 9}}});
    ASSERT_EQ(p.prompts.size(), 1u);
    EXPECT_EQ(*p.prompts[0].ids, (std::vector<int32_t>{1, 5, 9}));
  }
  {
    const ParsedRequest p = cmpl({{"prompt", {{1, 2}, {3}}}});
    ASSERT_EQ(p.prompts.size(), 2u);
    EXPECT_EQ(*p.prompts[0].ids, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(*p.prompts[1].ids, (std::vector<int32_t>{3}));
  }
  // "" parses: whether it has tokens (BOS) is the service's call.
  EXPECT_EQ(cmpl({{"prompt", ""}}).prompts.at(0).text, "");
}

TEST(OpenAiCodec, BadPromptShapesAre400) {
  for (const json& p : {json::array(), json::array({"a", 1}), json::array({json::array({1}), "b"}), json(5),
                        json::array({-1}), json::array({json::array({1, -2})}), json::array({1.5}),
                        json::array({uint64_t(1) << 40}), json::object()}) {
    const ApiError e = cmpl_error({{"prompt", p}});
    EXPECT_EQ(e.status, 400) << p;
    EXPECT_EQ(e.param, "prompt") << p;
  }
  EXPECT_EQ(cmpl_error(json::object()).message, "'prompt' is required");
  json many = json::array();
  for (int i = 0; i <= kMaxPrompts; ++i) many.push_back("x");
  EXPECT_NE(cmpl_error({{"prompt", many}}).message.find("more than"), std::string::npos);
  // prompts x n is bounded too.
  json four = json::array({"a", "b", "c", "d", "e"});
  EXPECT_EQ(cmpl_error({{"prompt", four}, {"n", 16}}).param, "n");
}

TEST(OpenAiCodec, Echo) {
  EXPECT_TRUE(cmpl({{"prompt", "x"}, {"echo", true}}).echo);
  EXPECT_FALSE(cmpl({{"prompt", "x"}}).echo);
  EXPECT_EQ(cmpl_error({{"prompt", "x"}, {"echo", "yes"}}).param, "echo");
  // With logprobs the prompt's own logprobs come too (the service asks the engine).
  const ParsedRequest both = cmpl({{"prompt", "x"}, {"echo", true}, {"logprobs", 2}});
  EXPECT_TRUE(both.echo && both.logprobs);
  EXPECT_EQ(both.top_logprobs, 2);
}

TEST(OpenAiCodec, JsonErrorsNameTheOffsetNotTheParserOrTheText) {
  const std::string body = "{\"prompt\": \"secret words\" oops}";
  const ApiError e = error_of(Endpoint::Completions, body);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.message.find("json.exception"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("secret"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("oops"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("byte 27"), std::string::npos) << e.message;
  EXPECT_NE(error_of(Endpoint::Chat, "").message.find("empty"), std::string::npos);
  EXPECT_EQ(error_of(Endpoint::Chat, "[1]").message, "request body must be a JSON object");
}

TEST(OpenAiCodec, PriorityIsAnIntegerAndSloClassAName) {
  EXPECT_EQ(cmpl({{"prompt", "x"}, {"priority", 0}}).slo, sched::SloClass::Interactive);
  EXPECT_EQ(cmpl({{"prompt", "x"}, {"priority", -3}}).slo, sched::SloClass::Interactive);
  EXPECT_EQ(cmpl({{"prompt", "x"}, {"priority", 2}}).slo, sched::SloClass::Batch);
  EXPECT_EQ(cmpl({{"prompt", "x"}, {"slo_class", "batch"}}).slo, sched::SloClass::Batch);
  EXPECT_FALSE(cmpl({{"prompt", "x"}}).slo);
  // The docs say priority is vLLM's integer: its error says so too.
  const ApiError e = cmpl_error({{"prompt", "x"}, {"priority", "batch"}});
  EXPECT_EQ(e.param, "priority");
  EXPECT_NE(e.message.find("integer"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("slo_class"), std::string::npos) << e.message;
  EXPECT_EQ(cmpl_error({{"prompt", "x"}, {"priority", 1.5}}).param, "priority");
  EXPECT_EQ(cmpl_error({{"prompt", "x"}, {"slo_class", 1}}).param, "slo_class");
  EXPECT_EQ(cmpl_error({{"prompt", "x"}, {"slo_class", "urgent"}}).param, "slo_class");
}

TEST(OpenAiCodec, ChatFields) {
  const ParsedRequest p = parse_request(
      Endpoint::Chat,
      json{{"messages", {{{"role", "developer"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}},
           {"max_completion_tokens", 7},
           {"logprobs", true},
           {"top_logprobs", 3}}
          .dump());
  ASSERT_EQ(p.messages.size(), 2u);
  EXPECT_EQ(p.messages[0].role, "system");
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.top_logprobs, 3);
  EXPECT_EQ(error_of(Endpoint::Chat, json{{"messages", {{{"role", "user"}}}}, {"top_logprobs", 2}}.dump()).param,
            "top_logprobs");
}

TEST(OpenAiCodec, ChatResponseHasRefusalAndFingerprint) {
  ResponseMeta meta{"chatcmpl-1", 1700000000, "m", "fp_abc"};
  ChoiceResult c;
  c.text = "hello";
  c.finish = sched::FinishReason::Stop;
  c.logprobs = {{7, -0.5f}};
  c.top_logprobs = {{{7, -0.5f}, {8, -1.5f}}};
  sched::Usage u{3, 1, 0};
  const json r = completion_response(Endpoint::Chat, meta, {c}, u, true, token_text);
  EXPECT_EQ(r["system_fingerprint"], "fp_abc");
  const json& ch = r["choices"][0];
  ASSERT_TRUE(ch["message"].contains("refusal"));
  EXPECT_TRUE(ch["message"]["refusal"].is_null());
  ASSERT_TRUE(ch["logprobs"].contains("refusal"));
  EXPECT_TRUE(ch["logprobs"]["refusal"].is_null());
  EXPECT_EQ(ch["logprobs"]["content"][0]["token"], "t7");
  EXPECT_EQ(ch["logprobs"]["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(r["usage"]["total_tokens"], 4);

  sched::TokenEvent e;
  e.choice = 3;
  e.token = 7;
  e.text = "he";
  e.logprob = sched::TokenLogprob{7, -0.5f};
  const json first = stream_chunk(Endpoint::Chat, meta, e, true, true, token_text);
  EXPECT_EQ(first["system_fingerprint"], "fp_abc");
  EXPECT_EQ(first["choices"][0]["index"], 3);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["delta"]["refusal"].is_null());
  EXPECT_TRUE(first["choices"][0]["logprobs"]["refusal"].is_null());
  const json later = stream_chunk(Endpoint::Chat, meta, e, false, false, token_text);
  EXPECT_FALSE(later["choices"][0]["delta"].contains("role"));
  EXPECT_TRUE(later["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(usage_chunk(Endpoint::Chat, meta, u)["system_fingerprint"], "fp_abc");
}

TEST(OpenAiCodec, CompletionChoicesAreIndexedByPosition) {
  ResponseMeta meta{"cmpl-1", 1, "m", ""};
  std::vector<ChoiceResult> cs(4);
  for (size_t i = 0; i < cs.size(); ++i) cs[i].text = std::to_string(i);
  const json r = completion_response(Endpoint::Completions, meta, cs, {}, false, token_text);
  EXPECT_FALSE(r.contains("system_fingerprint"));
  ASSERT_EQ(r["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], std::to_string(i));
    EXPECT_TRUE(r["choices"][i]["logprobs"].is_null());
  }
}

TEST(OpenAiCodec, ErrorBody) {
  ApiError e = bad_request("bad thing", "n");
  const json j = json::parse(error_body(e));
  EXPECT_EQ(j["error"]["message"], "bad thing");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

// Nothing that would change the output is ignored: every field is in the
// table (server/request_fields.h), an unknown one is a 400 naming it, a
// known one kvserve does not implement too, and the client's bookkeeping
// fields are accepted.
TEST(OpenAiCodec, UnknownAndUnsupportedFieldsAre400NamingThem) {
  const ApiError unknown = cmpl_error({{"prompt", "hi"}, {"temprature", 0.5}});
  EXPECT_EQ(unknown.status, 400);
  EXPECT_EQ(unknown.param, "temprature");
  EXPECT_NE(unknown.message.find("unknown field 'temprature'"), std::string::npos) << unknown.message;
  // A chat-only field on completions is unknown there.
  EXPECT_EQ(cmpl_error({{"prompt", "hi"}, {"top_logprobs", 2}}).param, "top_logprobs");
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  for (const char* k : {"tools", "tool_choice", "functions", "audio", "prediction"}) {
    json body = {{"messages", msgs}};
    body[k] = k == std::string("tool_choice") ? json("required") : json::object({{"type", "json_object"}});
    // (tools in the Responses API's shape: no "function" object)
    if (k == std::string("tools")) body[k] = json::array({{{"type", "function"}, {"name", "f"}}});
    const ApiError e = error_of(Endpoint::Chat, body.dump());
    EXPECT_EQ(e.param, k);
    EXPECT_EQ(e.status, 400);
  }
  EXPECT_EQ(cmpl_error({{"prompt", "hi"}, {"suffix", "end"}}).param, "suffix");
  EXPECT_EQ(cmpl_error({{"prompt", "hi"}, {"best_of", 3}}).param, "best_of");
  // Trivial forms change nothing and are accepted; so is bookkeeping.
  EXPECT_NO_THROW(cmpl({{"prompt", "hi"}, {"best_of", 1}, {"user", "u-1"}, {"metadata", {{"a", "b"}}}}));
  EXPECT_NO_THROW(parse_request(Endpoint::Chat, json{{"messages", msgs},
                                                     {"tool_choice", "none"},
                                                     {"modalities", {"text"}},
                                                     {"store", false},
                                                     {"service_tier", "auto"}}
                                                    .dump()));
}

TEST(OpenAiCodec, PenaltiesLogitBiasMinTokensAndStopIds) {
  const ParsedRequest p = cmpl({{"prompt", "hi"},
                                {"presence_penalty", 0.5},
                                {"frequency_penalty", -1.25},
                                {"logit_bias", {{"42", -100}, {"7", 2.5}}},
                                {"min_tokens", 3},
                                {"stop_token_ids", {2, 13}}});
  EXPECT_FLOAT_EQ(p.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.sampling.frequency_penalty, -1.25f);
  ASSERT_EQ(p.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(p.sampling.logit_bias[0], (std::pair<int32_t, float>{42, -100.0f}));
  EXPECT_EQ(p.sampling.logit_bias[1], (std::pair<int32_t, float>{7, 2.5f}));
  EXPECT_EQ(p.min_tokens, 3);
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{2, 13}));
  EXPECT_EQ(cmpl_error({{"prompt", "hi"}, {"presence_penalty", 2.5}}).param, "presence_penalty");
  EXPECT_EQ(cmpl_error({{"prompt", "hi"}, {"logit_bias", {{"x1", 1}}}}).param, "logit_bias");
  EXPECT_EQ(cmpl_error({{"prompt", "hi"}, {"logit_bias", {{"1", 101}}}}).param, "logit_bias");
  EXPECT_EQ(cmpl_error({{"prompt", "hi"}, {"logit_bias", json::array()}}).param, "logit_bias");
  EXPECT_EQ(cmpl_error({{"prompt", "hi"}, {"stop_token_ids", {-1}}}).param, "stop_token_ids");
  EXPECT_EQ(cmpl_error({{"prompt", "hi"}, {"min_tokens", -1}}).param, "min_tokens");
}

// response_format and grammar compile to a grammar at parse time: an error
// is a 400 naming the field, and for a schema the keyword.
TEST(OpenAiCodec, ResponseFormatAndGrammar) {
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto chat = [&](const json& extra) {
    json b = {{"messages", msgs}};
    b.update(extra);
    return b.dump();
  };
  EXPECT_EQ(parse_request(Endpoint::Chat, chat({{"response_format", {{"type", "text"}}}})).grammar, nullptr);
  EXPECT_NE(parse_request(Endpoint::Chat, chat({{"response_format", {{"type", "json_object"}}}})).grammar, nullptr);
  const std::string schema =
      R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema",
          "json_schema": {"name": "x", "strict": true, "schema": {"type": "object",
          "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false}}}})";
  EXPECT_NE(parse_request(Endpoint::Chat, schema).grammar, nullptr);
  std::string bad = schema;
  bad.replace(bad.find("\"type\": \"string\""), 16, "\"type\": \"string\", \"pattern\": \"x+\"");
  const ApiError e = error_of(Endpoint::Chat, bad);
  EXPECT_EQ(e.param, "response_format");
  EXPECT_NE(e.message.find("'pattern'"), std::string::npos) << e.message;
  EXPECT_NE(cmpl({{"prompt", "x"}, {"grammar", "root ::= \"a\"+"}}).grammar, nullptr);
  const ApiError g = cmpl_error({{"prompt", "x"}, {"grammar", "root ::= \"a\"\nroot ::= b"}});
  EXPECT_EQ(g.param, "grammar");
  EXPECT_NE(g.message.find("line 2"), std::string::npos) << g.message;
  EXPECT_EQ(error_of(Endpoint::Chat, chat({{"response_format", {{"type", "yaml"}}}})).param, "response_format");
  EXPECT_EQ(error_of(Endpoint::Chat, chat({{"response_format", {{"type", "json_object"}}}, {"grammar", "root ::= \"a\""}})).param,
            "grammar");
}
