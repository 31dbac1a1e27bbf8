// The OpenAI codec without sockets or a model: request bodies in (prompt
// shapes, echo, priority, JSON errors), response objects and stream chunks
// out (indices, refusal, system_fingerprint); nested fields, vocabulary
// checks and logprob text offsets.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/logprob_hold.h"
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
  EXPECT_EQ(error_of(Endpoint::Chat, json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"top_logprobs", 2}}.dump())
                .param,
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
  const std::vector<LogprobEntry> lps = {{*e.logprob, {}}};
  const json first = stream_chunk(Endpoint::Chat, meta, e, true, &lps, token_text);
  EXPECT_EQ(first["system_fingerprint"], "fp_abc");
  EXPECT_EQ(first["choices"][0]["index"], 3);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["delta"]["refusal"].is_null());
  EXPECT_TRUE(first["choices"][0]["logprobs"]["refusal"].is_null());
  const json later = stream_chunk(Endpoint::Chat, meta, e, false, nullptr, token_text);
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

// Token ids outside the vocabulary and min_tokens over max_tokens are the
// codec's 400s, naming the field (the scheduler's reject could not).
TEST(OpenAiCodec, VocabularyAndMinTokensAreCheckedWithTheirField) {
  auto err = [](const json& body) {
    try {
      parse_request(Endpoint::Completions, body.dump(), 100);
    } catch (const ApiError& e) {
      return e;
    }
    ADD_FAILURE() << "accepted: " << body;
    return ApiError{};
  };
  const ApiError lb = err({{"prompt", "x"}, {"logit_bias", {{"100", 1}}}});
  EXPECT_EQ(lb.param, "logit_bias");
  EXPECT_NE(lb.message.find("token id 100 is outside the vocabulary of 100"), std::string::npos) << lb.message;
  const ApiError st = err({{"prompt", "x"}, {"stop_token_ids", {5, 9999}}});
  EXPECT_EQ(st.param, "stop_token_ids");
  EXPECT_NE(st.message.find("9999"), std::string::npos) << st.message;
  const ApiError mt = err({{"prompt", "x"}, {"max_tokens", 5}, {"min_tokens", 6}});
  EXPECT_EQ(mt.param, "min_tokens");
  EXPECT_EQ(mt.status, 400);
  EXPECT_NO_THROW(parse_request(Endpoint::Completions,
                                json{{"prompt", "x"}, {"logit_bias", {{"99", 1}}}, {"stop_token_ids", {99}},
                                     {"max_tokens", 5}, {"min_tokens", 5}}
                                    .dump(),
                                100));
  // Without a vocabulary (the router's hasher) ids are left to the scheduler.
  EXPECT_NO_THROW(cmpl({{"prompt", "x"}, {"logit_bias", {{"9999", 1}}}}));
}

// Nested objects are as strict as the top level: an unknown key is a 400
// naming its path. stream_options needs stream; user is a string.
TEST(OpenAiCodec, NestedUnknownFieldsAre400NamingThePath) {
  EXPECT_EQ(cmpl_error({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"include_usage", true}, {"foo", 1}}}})
                .param,
            "stream_options.foo");
  const ApiError ns = cmpl_error({{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}});
  EXPECT_EQ(ns.param, "stream_options");
  EXPECT_NE(ns.message.find("'stream' is true"), std::string::npos) << ns.message;
  EXPECT_EQ(cmpl_error({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"include_usage", 1}}}}).param,
            "stream_options.include_usage");
  // continuous_usage_stats (vLLM) is implemented, on top of include_usage.
  const ParsedRequest cu = cmpl({{"prompt", "x"},
                                 {"stream", true},
                                 {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}});
  EXPECT_TRUE(cu.include_usage && cu.continuous_usage);
  EXPECT_EQ(cmpl_error({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"continuous_usage_stats", true}}}})
                .param,
            "stream_options.continuous_usage_stats");
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto chat_err = [&](const json& rf) {
    return error_of(Endpoint::Chat, json{{"messages", msgs}, {"response_format", rf}}.dump());
  };
  EXPECT_EQ(chat_err({{"type", "json_object"}, {"foo", 1}}).param, "response_format.foo");
  const json js = {{"name", "a"}, {"schema", {{"type", "object"}}}, {"foo", 1}};
  EXPECT_EQ(chat_err({{"type", "json_schema"}, {"json_schema", js}}).param, "response_format.json_schema.foo");
  EXPECT_EQ(chat_err({{"type", "json_object"}, {"json_schema", {{"schema", json::object()}}}}).param,
            "response_format.json_schema");
  EXPECT_NO_THROW(parse_request(Endpoint::Chat, json{{"messages", msgs},
                                                     {"response_format",
                                                      {{"type", "json_schema"},
                                                       {"json_schema",
                                                        {{"name", "a"}, {"description", "d"}, {"strict", true},
                                                         {"schema", {{"type", "object"}}}}}}}}
                                                    .dump()));
  EXPECT_EQ(cmpl_error({{"prompt", "x"}, {"user", json::array({1})}}).param, "user");
}

// A user, system or tool message must carry content; an assistant turn
// that made tool calls may leave it null.
TEST(OpenAiCodec, MessagesWithoutContentAre400) {
  for (const char* role : {"user", "system", "developer", "tool"}) {
    const ApiError e = error_of(Endpoint::Chat, json{{"messages", {{{"role", role}}}}}.dump());
    EXPECT_EQ(e.param, "messages[0].content") << role;
  }
  const json null_content = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "system"}, {"content", nullptr}}}}};
  EXPECT_EQ(error_of(Endpoint::Chat, null_content.dump()).param, "messages[1].content");
  const json calls = {{"messages",
                       {{{"role", "user"}, {"content", "hi"}},
                        {{"role", "assistant"},
                         {"content", nullptr},
                         {"tool_calls",
                          {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}},
                        {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "42"}}}}};
  EXPECT_NO_THROW(parse_request(Endpoint::Chat, calls.dump()));
  EXPECT_NO_THROW(parse_request(Endpoint::Chat, json{{"messages", {{{"role", "user"}, {"content", ""}}}}}.dump()));
}

TEST(OpenAiCodec, MessagesThatDoNotMislead) {
  // A body cut off: the end, not an offset past it.
  const ApiError cut = error_of(Endpoint::Completions, "{\"prompt\":\"x\",");
  EXPECT_NE(cut.message.find("unexpected end of the body"), std::string::npos) << cut.message;
  EXPECT_EQ(cut.message.find("byte 15"), std::string::npos) << cut.message;
  // A top_p too small for a float is still a top_p above 0.
  const ParsedRequest p = cmpl({{"prompt", "x"}, {"top_p", 1e-300}});
  EXPECT_GT(p.sampling.top_p, 0.0f);
  EXPECT_EQ(cmpl_error({{"prompt", "x"}, {"top_p", 0}}).param, "top_p");
}

namespace {

// A SentencePiece-like vocabulary: 1 is BOS (no text), the first word's
// piece carries the space the text does not start with.
std::string sp_text(int32_t id) {
  static const std::vector<std::string> pieces = {"?", "", " Once", " upon", " a", " time", ",", " there", " was"};
  return id >= 0 && size_t(id) < pieces.size() ? pieces[size_t(id)] : "?";
}

// "Once upon a time" after BOS, as the engine reports its logprobs.
std::vector<sched::PromptLogprob> sp_prompt() {
  std::vector<sched::PromptLogprob> v;
  for (int32_t id = 1; id <= 5; ++id)
    v.push_back({id - 1, id, id == 1 ? std::nullopt : std::optional<float>(-1.0f), {}});
  return v;
}

// text[text_offset[i]:] starts with tokens[i], for every i.
void expect_offsets_index_the_text(const std::string& text, const json& lp) {
  ASSERT_EQ(lp["tokens"].size(), lp["text_offset"].size()) << lp;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    const size_t off = lp["text_offset"][i];
    const std::string tok = lp["tokens"][i];
    ASSERT_LE(off, text.size()) << i << " " << lp;
    EXPECT_EQ(text.compare(off, tok.size(), tok), 0) << i << " '" << tok << "' at " << off << " of '" << text << "'";
  }
}

}  // namespace

// Echo + logprobs: the offsets index the returned text, whose echoed prompt
// has no leading space.
TEST(OpenAiCodec, EchoedTextOffsetsIndexTheText) {
  ResponseMeta meta{"cmpl-1", 1, "m", ""};
  ChoiceResult c;
  c.text = "Once upon a time, there";
  c.echo_bytes = 16;
  c.prompt_logprobs = sp_prompt();
  c.logprobs = {{6, -0.5f}, {7, -0.5f}};
  c.top_logprobs = {{}, {}};
  const json r = completion_response(Endpoint::Completions, meta, {c}, {}, true, sp_text);
  const json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(lp["text_offset"], json::array({0, 0, 4, 9, 11, 16, 17})) << lp;
  EXPECT_EQ(lp["tokens"][1], "Once");
  expect_offsets_index_the_text(c.text, lp);
  // Without echo the pieces are the text as generated.
  ChoiceResult g;
  g.text = ", there was";
  g.logprobs = {{6, -0.5f}, {7, -0.5f}, {8, -0.5f}};
  g.top_logprobs = {{}, {}, {}};
  const json rg = completion_response(Endpoint::Completions, meta, {g}, {}, true, sp_text);
  EXPECT_EQ(rg["choices"][0]["logprobs"]["text_offset"], json::array({0, 1, 7}));
}

// Streamed: the offsets run on across chunks, the same as without streaming.
TEST(OpenAiCodec, StreamedTextOffsetsCountTheWholeText) {
  ResponseMeta meta{"cmpl-1", 1, "m", ""};
  for (bool echo : {false, true}) {
    TextOffsets offs;
    if (echo) offs.echo = "Once upon a time";
    std::string text;
    json all = {{"tokens", json::array()}, {"text_offset", json::array()}};
    for (int32_t id : {6, 7, 8}) {
      sched::TokenEvent e;
      e.choice = 0;
      e.token = id;
      e.text = sp_text(id);
      e.logprob = sched::TokenLogprob{id, -0.5f};
      if (id == 6 && echo) {
        e.prompt_logprobs = sp_prompt();
        e.text = offs.echo + e.text;
      }
      const std::vector<LogprobEntry> lps = {{*e.logprob, {}}};
      const json ch = stream_chunk(Endpoint::Completions, meta, e, id == 6, &lps, sp_text, nullptr, &offs);
      text += ch["choices"][0]["text"].get<std::string>();
      for (const char* k : {"tokens", "text_offset"})
        for (const json& v : ch["choices"][0]["logprobs"][k]) all[k].push_back(v);
    }
    const json want = echo ? json::array({0, 0, 4, 9, 11, 16, 17, 23}) : json::array({0, 1, 7});
    EXPECT_EQ(all["text_offset"], want) << all;
    expect_offsets_index_the_text(text, all);
  }
}

// Logprobs wait for their text and stop where a stop string cut it: " a",
// " g", "ir", "l" with the text " a", "", "", " g" + stop (stop string
// "irl": whole tokens kept) or " a", " g", "i", "" + stop ("rl": cut inside
// "ir"); any other finish lists every token left.
TEST(OpenAiCodec, LogprobHoldReleasesTokensWithTheirText) {
  const TokenText tt = [](int32_t id) { return std::string(id == 1 ? " a" : id == 2 ? " g" : id == 3 ? "ir" : "l"); };
  auto run = [&](const std::vector<std::string>& texts, sched::FinishReason finish) {
    LogprobHold h;
    std::vector<std::vector<int32_t>> out;
    for (int32_t id = 1; id <= 4; ++id) {
      sched::TokenEvent e;
      e.token = id;
      e.text = texts[size_t(id - 1)];
      e.logprob = sched::TokenLogprob{id, -1.0f};
      if (id == 4) e.finish = finish;
      out.emplace_back();
      for (const LogprobEntry& x : h.take(e, tt)) out.back().push_back(x.token.token);
    }
    return out;
  };
  using V = std::vector<std::vector<int32_t>>;
  EXPECT_EQ(run({" a", "", "", " g"}, sched::FinishReason::Stop), (V{{1}, {}, {}, {2}}));
  EXPECT_EQ(run({" a", " g", "i", ""}, sched::FinishReason::Stop), (V{{1}, {2}, {}, {3}}));
  EXPECT_EQ(run({" a", "", "", " gir"}, sched::FinishReason::Length), (V{{1}, {}, {}, {2, 3, 4}}));
}

// Legacy completions' top_logprobs hold the sampled token beside the k best
// (k + 1 entries at most, as OpenAI and vLLM; with logprobs 0 just the
// token), keyed as `tokens` spells it: an echoed first prompt piece " Once"
// is "Once" in both. Before, a sampled token outside the k best had no entry,
// logprobs 0 gave {}, and the echoed token's key kept the space.
TEST(OpenAiCodec, LegacyTopLogprobsIncludeTheSampledToken) {
  ResponseMeta meta{"cmpl-1", 1, "m", ""};
  ChoiceResult c;
  c.text = ", there was";
  c.logprobs = {{6, -0.5f}, {7, -2.0f}, {8, -0.25f}};
  c.top_logprobs = {{{6, -0.5f}, {7, -1.5f}}, {{6, -0.5f}, {8, -1.0f}}, {}};
  const json lp = completion_response(Endpoint::Completions, meta, {c}, {}, true, sp_text)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["top_logprobs"][0], (json{{",", -0.5}, {" there", -1.5}}));                      // already among them
  EXPECT_EQ(lp["top_logprobs"][1], (json{{",", -0.5}, {" was", -1.0}, {" there", -2.0}}));      // k + 1
  EXPECT_EQ(lp["top_logprobs"][2], (json{{" was", -0.25}}));                                   // logprobs: 0
  ChoiceResult e;
  e.text = "Once upon a time,";
  e.echo_bytes = 16;
  e.prompt_logprobs = sp_prompt();
  e.prompt_logprobs[1].top = {{2, -1.0f}, {3, -2.0f}};
  e.logprobs = {{6, -0.5f}};
  e.top_logprobs = {{}};
  const json le = completion_response(Endpoint::Completions, meta, {e}, {}, true, sp_text)["choices"][0]["logprobs"];
  EXPECT_EQ(le["tokens"][1], "Once");
  EXPECT_EQ(le["top_logprobs"][1], (json{{"Once", -1.0}, {" upon", -2.0}}));
  EXPECT_TRUE(le["top_logprobs"][0].is_null());
}

// seed -1 is llama-server's "random": not a fixed seed (every such request
// gave the same text); other negative seeds stay fixed seeds.
TEST(OpenAiCodec, SeedMinusOneMeansRandom) {
  EXPECT_FALSE(cmpl({{"prompt", "x"}, {"seed", -1}}).seeded);
  EXPECT_FALSE(cmpl({{"prompt", "x"}}).seeded);
  const ParsedRequest minus2 = cmpl({{"prompt", "x"}, {"seed", -2}});
  EXPECT_TRUE(minus2.seeded);
  EXPECT_EQ(minus2.sampling.seed, uint64_t(int64_t(-2)));
  EXPECT_TRUE(cmpl({{"prompt", "x"}, {"seed", 0}}).seeded);
}

// Message errors name the field at fault: the role error lists every role
// taken (it said "system, user or assistant" though tool and developer work)
// and names messages[i].role; content errors name messages[i].content (both
// said "messages").
TEST(OpenAiCodec, MessageErrorsNameTheRoleOrContent) {
  auto chat_error = [](const json& messages) { return error_of(Endpoint::Chat, json{{"messages", messages}}.dump()); };
  const json ok = {{"role", "user"}, {"content", "x"}};
  const ApiError role = chat_error({ok, {{"role", "wizard"}, {"content", "x"}}});
  EXPECT_EQ(role.param, "messages[1].role");
  for (const char* r : {"system", "developer", "user", "assistant", "tool"})
    EXPECT_NE(role.message.find(r), std::string::npos) << role.message;
  EXPECT_EQ(chat_error({{{"content", "x"}}}).param, "messages[0].role");
  EXPECT_EQ(chat_error({ok, 5}).param, "messages[1]");
  EXPECT_EQ(chat_error({ok, {{"role", "user"}, {"content", 5}}}).param, "messages[1].content");
  EXPECT_EQ(chat_error({{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}).param, "messages[0].content");
}
