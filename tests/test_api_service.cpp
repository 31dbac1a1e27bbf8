// The HTTP API without sockets: ApiService over a real engine loop whose
// executor is the scheduler's FakeExecutor (exact block accounting, made-up
// logits) and the built-in byte vocabulary. Several prompts per request,
// echo, empty prompts, /v1/models auth and created, and the request log
// (real counts for a client that left, rejections logged with the tenant
// hash and never text).
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>
#include <tuple>

#include "sched/engine_loop.h"
#include "fake_executor.h"
#include "server/api_service.h"
#include "tokenizer/tokenizer.h"
#include "tools/byte_vocab.h"

using namespace kvs;
using namespace kvs::server;
using nlohmann::json;

namespace {

constexpr int kVocab = 320;

struct RigOptions {
  bool add_bos = true;
  int32_t n_blocks = 256;
  double request_share = 1.0, tenant_share = 1.0;
  std::string keys_json;  // "" = no auth
};

// A served "model": tokenizer, engine loop over the fake executor, tenants
// and the service, with the log lines captured.
struct Rig {
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<sched::EngineLoop> loop;
  std::unique_ptr<TenantRegistry> tenants;
  std::unique_ptr<ApiService> api;
  std::mutex mu;
  std::vector<std::string> logs;

  explicit Rig(const RigOptions& o = {}) {
    Vocab v = builtin_byte_vocab(kVocab);
    v.add_bos = o.add_bos;
    tok = Tokenizer::create(v);
    sched::FakeExecutorOptions fo;
    fo.n_blocks = o.n_blocks;
    fo.n_vocab = kVocab;
    fo.max_ctx = 4096;
    sched::EngineLoopOptions lo;
    lo.block_size = fo.block_size;
    lo.max_ctx = fo.max_ctx;
    lo.sched.max_request_share = o.request_share;
    lo.sched.tenant_quota_share = o.tenant_share;
    lo.sched.kv_headroom = 0;
    lo.log = [this](const std::string& s) { add_log("loop: " + s); };
    loop = std::make_unique<sched::EngineLoop>(std::make_unique<sched::FakeExecutor>(fo), tok.get(), lo);
    tenants = o.keys_json.empty() ? std::make_unique<TenantRegistry>() : TenantRegistry::from_json(o.keys_json, "keys");
    ApiOptions ao;
    ao.model_id = "fake";
    ao.model_identity = "0123456789abcdef";
    ao.ctx = fo.max_ctx;
    ao.model_created = 1700000000;
    ao.log = [this](const std::string& s) { add_log(s); };
    api = std::make_unique<ApiService>(*loop, *tok, *tenants, ao);
    api->set_ready(true);
  }
  void add_log(const std::string& s) {
    std::lock_guard lk(mu);
    logs.push_back(s);
  }
  std::vector<std::string> log_lines(const std::string& with) {
    std::lock_guard lk(mu);
    std::vector<std::string> v;
    for (const auto& l : logs)
      if (l.find(with) != std::string::npos) v.push_back(l);
    return v;
  }
};

struct Result {
  int status = 0;
  json body;                // whole responses
  std::vector<json> events; // streams: SSE data objects ([DONE] -> null)
};

// SSE frames' data objects ([DONE] -> null); a frame may name its event
// first ("event: T"), which /v1/responses does: then the data object must
// carry the same "type".
std::vector<json> sse_events(const std::string& data) {
  std::vector<json> v;
  size_t p = 0, e;
  while ((e = data.find("\n\n", p)) != std::string::npos) {
    std::string frame = data.substr(p, e - p), name;
    if (frame.rfind("event: ", 0) == 0) {
      const size_t nl = frame.find('\n');
      name = frame.substr(7, nl - 7);
      frame = frame.substr(nl + 1);
    }
    const std::string d = frame.substr(6);  // after "data: "
    v.push_back(d == "[DONE]" ? json(nullptr) : json::parse(d));
    if (!name.empty()) {
      EXPECT_EQ(v.back()["type"], name);
    }
    p = e + 2;
  }
  return v;
}

// Drives one exchange to its end as the HTTP session would.
Result drive(Routed r) {
  Result res;
  if (!r.exchange) {
    res.status = r.response.status;
    res.body = json::parse(r.response.body);
    return res;
  }
  std::string data;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    Exchange::Output out = r.exchange->poll();
    if (out.full) {
      res.status = out.full->status;
      res.body = json::parse(out.full->body);
      return res;
    }
    if (out.start_stream) res.status = 200;
    data += out.data;
    if (out.done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  res.events = sse_events(data);
  return res;
}

HttpRequest post(const std::string& path, const json& body, const std::string& auth = "") {
  return HttpRequest{"POST", path, auth, body.dump()};
}

Result complete(Rig& rig, const json& body, const std::string& auth = "") {
  return drive(rig.api->handle(post("/v1/completions", body, auth), [] {}));
}

}  // namespace

TEST(ApiService, EmptyPromptIsBosWhenTheModelAddsOne) {
  {
    Rig rig;
    const Result r = complete(rig, {{"prompt", ""}, {"max_tokens", 2}, {"ignore_eos", true}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body["usage"]["prompt_tokens"], 1);
    EXPECT_EQ(r.body["usage"]["completion_tokens"], 2);
  }
  {
    RigOptions o;
    o.add_bos = false;
    Rig rig(o);
    const Result r = complete(rig, {{"prompt", ""}, {"max_tokens", 2}});
    ASSERT_EQ(r.status, 400);
    EXPECT_EQ(r.body["error"]["param"], "prompt");
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find("BOS"), std::string::npos) << r.body;
    // Token ids are used as given: an empty list has nothing to start from.
    EXPECT_EQ(complete(rig, {{"prompt", {json::array(), {5}}}}).status, 400);
  }
}

TEST(ApiService, SeveralPromptsGetPromptMajorChoicesAndSummedUsage) {
  Rig rig;
  const json base = {{"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}};
  const std::vector<std::string> prompts = {"Once upon a time", "the cat"};
  std::vector<Result> alone;
  for (const auto& p : prompts) {
    json b = base;
    b["prompt"] = p;
    alone.push_back(complete(rig, b));
    ASSERT_EQ(alone.back().status, 200);
  }
  json b = base;
  b["prompt"] = prompts;
  b["n"] = 2;
  const Result r = complete(rig, b);
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.body["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.body["choices"][i]["index"], i);
    // index = prompt * n + choice; greedy choices of one prompt agree.
    EXPECT_EQ(r.body["choices"][i]["text"], alone[size_t(i / 2)].body["choices"][0]["text"]) << i;
    EXPECT_EQ(r.body["choices"][i]["finish_reason"], "length");
  }
  const int p0 = alone[0].body["usage"]["prompt_tokens"], p1 = alone[1].body["usage"]["prompt_tokens"];
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], p0 + p1);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 20);
  EXPECT_EQ(r.body["usage"]["total_tokens"], p0 + p1 + 20);

  // Streamed: every index gets its text and one finish; the usage chunk sums.
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  const Result s = complete(rig, b);
  ASSERT_EQ(s.status, 200);
  ASSERT_FALSE(s.events.empty());
  EXPECT_TRUE(s.events.back().is_null());
  std::vector<std::string> text(4);
  std::vector<int> finishes(4);
  json usage;
  for (const json& e : s.events) {
    if (e.is_null()) continue;
    if (e.contains("usage")) usage = e["usage"];
    for (const json& c : e["choices"]) {
      const int i = c["index"];
      ASSERT_LT(i, 4);
      text[size_t(i)] += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) ++finishes[size_t(i)];
    }
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(text[size_t(i)], r.body["choices"][i]["text"]) << i;
    EXPECT_EQ(finishes[size_t(i)], 1) << i;
  }
  EXPECT_EQ(usage["prompt_tokens"], p0 + p1);
  EXPECT_EQ(usage["completion_tokens"], 20);

  // Token-id prompts, several of them.
  json ids = base;
  ids["prompt"] = {{1, 40, 41}, {1, 50}};
  const Result t = complete(rig, ids);
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.body["choices"].size(), 2u);
  EXPECT_EQ(t.body["usage"]["prompt_tokens"], 5);
}

TEST(ApiService, SeveralPromptsShareTheirCommonPrefix) {
  Rig rig;
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += " the cat saw a dog";
  const Result r = complete(rig, {{"prompt", {long_prompt, long_prompt}}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  const int P = r.body["usage"]["prompt_tokens"].get<int>() / 2;
  ASSERT_GT(P, 64);
  // The second prompt's full blocks come from the first one's.
  EXPECT_GE(r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), P - 16) << r.body["usage"];
}

TEST(ApiService, ARejectedPromptCancelsTheOthers) {
  RigOptions o;
  o.n_blocks = 64;
  o.request_share = 0.5;  // half the pool per request
  Rig rig(o);
  std::string big;
  for (int i = 0; i < 120; ++i) big += " the cat saw a dog";
  // The first prompt is accepted; the second needs more than the share: 400.
  const Result r = complete(rig, {{"prompt", {"Once upon a time", big}}, {"max_tokens", 400}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.body["error"]["code"], "request_share");
  rig.loop->wait_idle();
  const sched::MetricsSnapshot m = rig.loop->metrics();
  EXPECT_EQ(m.running_requests, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_cancelled, 1) << "the accepted sibling is cancelled";
  EXPECT_LT(m.generated_tokens, 400);
  EXPECT_EQ(rig.log_lines("status=400").size(), 1u);
}

TEST(ApiService, ARetryableRejectionIs429ForTheWholeRequest) {
  RigOptions o;
  o.n_blocks = 64;
  o.tenant_share = 0.4;  // less than both prompts need together
  Rig rig(o);
  std::string p;
  for (int i = 0; i < 5; ++i) p += " the cat saw a dog";
  // Each prompt alone fits the tenant's share; both together do not.
  const json body = {{"prompt", {p, p + " again"}}, {"max_tokens", 200}, {"ignore_eos", true}};
  const Result r = complete(rig, body);
  ASSERT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.body["error"]["type"], "rate_limit_error");
  EXPECT_EQ(r.body["error"]["code"], "tenant_quota");
  rig.loop->wait_idle();
  const sched::MetricsSnapshot m = rig.loop->metrics();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_cancelled, 1) << "the accepted first prompt is cancelled";
  json one = body;
  one["prompt"] = p;
  const Result alone = complete(rig, one);
  EXPECT_EQ(alone.status, 200) << alone.body;
}

TEST(ApiService, EchoPrependsThePrompt) {
  Rig rig;
  const std::string prompt = "Once upon a time";
  const Result r = complete(rig, {{"prompt", prompt}, {"echo", true}, {"max_tokens", 3}, {"n", 2}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  for (const json& c : r.body["choices"]) {
    const std::string t = c["text"];
    EXPECT_EQ(t.rfind(prompt, 0), 0u) << t;
    EXPECT_GT(t.size(), prompt.size());
  }
  const Result s = complete(rig, {{"prompt", prompt}, {"echo", true}, {"max_tokens", 3}, {"stream", true}});
  ASSERT_EQ(s.status, 200);
  ASSERT_GE(s.events.size(), 2u);
  EXPECT_EQ(s.events[0]["choices"][0]["text"].get<std::string>().rfind(prompt, 0), 0u) << s.events[0];
  // Token ids echo as their text.
  const std::vector<int> ids = rig.tok->encode("the cat", false);
  const Result t = complete(rig, {{"prompt", ids}, {"echo", true}, {"max_tokens", 1}});
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.body["choices"][0]["text"].get<std::string>().rfind(rig.tok->decode(ids), 0), 0u);
  // Without echo the prompt is not repeated.
  const Result plain = complete(rig, {{"prompt", prompt}, {"max_tokens", 3}, {"ignore_eos", true}});
  EXPECT_NE(plain.body["choices"][0]["text"].get<std::string>().rfind(prompt, 0), 0u);
  // With logprobs: every prompt token leads the arrays, the first with null
  // logprob and alternatives; then the generated ones.
  const Result lp = complete(rig, {{"prompt", ids}, {"echo", true}, {"logprobs", 2}, {"max_tokens", 3}, {"ignore_eos", true}});
  ASSERT_EQ(lp.status, 200) << lp.body;
  const json& L = lp.body["choices"][0]["logprobs"];
  ASSERT_EQ(L["tokens"].size(), ids.size() + 3) << L;
  EXPECT_TRUE(L["token_logprobs"][0].is_null());
  EXPECT_TRUE(L["top_logprobs"][0].is_null());
  for (size_t i = 1; i < L["token_logprobs"].size(); ++i) {
    EXPECT_LE(L["token_logprobs"][i].get<double>(), 0.0) << i;
    EXPECT_LE(L["top_logprobs"][i].size(), 3u) << i;  // the 2 best and the token itself
    EXPECT_TRUE(L["top_logprobs"][i].contains(L["tokens"][i].get<std::string>())) << i << " " << L;
    EXPECT_GE(L["top_logprobs"][i].size(), 1u) << i;
  }
  EXPECT_EQ(L["tokens"][0], rig.tok->token_bytes(ids[0], -1));
  // Streamed: the first chunk carries the prompt's entries (and the first
  // token's once its text is out: a token whose bytes end mid-character
  // waits with its text); every entry arrives by the end.
  const Result ls = complete(rig, {{"prompt", ids}, {"echo", true}, {"logprobs", 0}, {"max_tokens", 2}, {"stream", true},
                                   {"ignore_eos", true}});
  ASSERT_EQ(ls.status, 200);
  ASSERT_GE(ls.events.size(), 2u);
  EXPECT_GE(ls.events[0]["choices"][0]["logprobs"]["tokens"].size(), ids.size()) << ls.events[0];
  size_t entries = 0;
  for (const json& e : ls.events)
    if (!e.is_null() && !e["choices"].empty() && !e["choices"][0]["logprobs"].is_null())
      entries += e["choices"][0]["logprobs"]["tokens"].size();
  EXPECT_EQ(entries, ids.size() + 2);
}

TEST(ApiService, ModelsNeedsAKeyWhenKeysAreRequired) {
  RigOptions o;
  o.keys_json = json{{"keys", {{{"key_sha256", sha256_hex("secret")}, {"tenant", "t"}}}}}.dump();
  Rig rig(o);
  auto models = [&](const std::string& auth) { return rig.api->handle({"GET", "/v1/models", auth, ""}, {}).response; };
  EXPECT_EQ(models("").status, 401);
  EXPECT_EQ(models("Bearer wrong").status, 401);
  const HttpResponse ok = models("bearer secret");
  ASSERT_EQ(ok.status, 200);
  const json j = json::parse(ok.body);
  EXPECT_EQ(j["data"][0]["id"], "fake");
  EXPECT_EQ(j["data"][0]["created"], 1700000000);
  EXPECT_EQ(complete(rig, {{"prompt", "x"}, {"max_tokens", 1}}, "BEARER secret").status, 200);
  EXPECT_EQ(complete(rig, {{"prompt", "x"}, {"max_tokens", 1}}).status, 401);
  // Health and metrics stay open (probes and scrapers).
  EXPECT_EQ(rig.api->handle({"GET", "/health", "", ""}, {}).response.status, 200);
  EXPECT_EQ(rig.api->handle({"GET", "/metrics", "", ""}, {}).response.status, 200);
}

TEST(ApiService, ResponsesCarryTheFingerprintAndChatTheRefusal) {
  Rig rig;
  const Result c = complete(rig, {{"prompt", "x"}, {"max_tokens", 1}});
  ASSERT_EQ(c.status, 200);
  EXPECT_EQ(c.body["system_fingerprint"], "fp_0123456789");
  const Result chat = drive(rig.api->handle(
      post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}, {"logprobs", true}, {"n", 2}}),
      [] {}));
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.body["system_fingerprint"], "fp_0123456789");
  ASSERT_EQ(chat.body["choices"].size(), 2u);
  for (const json& ch : chat.body["choices"]) {
    EXPECT_TRUE(ch["message"].contains("refusal") && ch["message"]["refusal"].is_null());
    EXPECT_TRUE(ch["logprobs"].contains("refusal") && ch["logprobs"]["refusal"].is_null());
  }
}

TEST(ApiService, ALeftClientIsLoggedWithItsRealCounts) {
  Rig rig;
  Routed r = rig.api->handle(
      post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", true}}),
      [] {});
  ASSERT_TRUE(r.exchange);
  int seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (seen < 3 && std::chrono::steady_clock::now() < deadline) {
    const Exchange::Output out = r.exchange->poll();
    ASSERT_FALSE(out.done) << "finished before the client left";
    for (size_t p = out.data.find("data: "); p != std::string::npos; p = out.data.find("data: ", p + 1)) ++seen;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(seen, 3);
  r.exchange->client_gone();
  r.exchange.reset();  // the session drops it: cancel, log
  const auto lines = rig.log_lines("client_gone");
  ASSERT_EQ(lines.size(), 1u);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(lines[0], m, std::regex("prompt_tokens=([0-9]+) .*completion_tokens=([0-9]+).* client_gone")))
      << lines[0];
  EXPECT_EQ(std::stoi(m[1]), int(rig.tok->encode("Once upon a time", true).size())) << lines[0];
  EXPECT_GE(std::stoi(m[2]), 3) << lines[0];
}

TEST(ApiService, RejectionsAreLoggedWithTheTenantHashAndNoText) {
  Rig rig;
  const std::string hash = tenant_hash("anonymous");
  EXPECT_EQ(drive(rig.api->handle({"POST", "/v1/completions", "", "{\"prompt\": \"private words"}, [] {})).status, 400);
  EXPECT_EQ(complete(rig, {{"prompt", "private words"}, {"max_tokens", 5000}}).status, 400);
  EXPECT_EQ(complete(rig, {{"prompt", "private words"}, {"model", "other"}}).status, 404);
  const auto lines = rig.log_lines("id=- tenant=" + hash);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find("status=400"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("error=context_length_exceeded"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("status=404 error=model_not_found"), std::string::npos) << lines[2];
  for (const auto& l : lines) EXPECT_EQ(l.find("private"), std::string::npos) << l;
}

// /v1/responses: the object (instructions, usage, incomplete at the token
// limit), the streamed events in order with increasing sequence numbers,
// previous_response_id continuing a stored conversation (and only for its
// own tenant), and the fields it refuses by name.
TEST(ApiService, ResponsesObjectStreamAndPreviousResponse) {
  RigOptions o;
  o.keys_json = json{{"keys", {{{"key_sha256", sha256_hex("ka")}, {"tenant", "a"}},
                               {{"key_sha256", sha256_hex("kb")}, {"tenant", "b"}}}}}.dump();
  Rig rig(o);
  auto resp = [&](const json& body, const std::string& key = "ka") {
    return drive(rig.api->handle(post("/v1/responses", body, "Bearer " + key), [] {}));
  };
  const Result r = resp({{"input", "Tell me"}, {"instructions", "Be brief."}, {"max_output_tokens", 5},
                         {"ignore_eos", true}});
  EXPECT_EQ(r.status, 400) << "ignore_eos is not a Responses field";
  EXPECT_EQ(r.body["error"]["param"], "ignore_eos");
  const Result a = resp({{"input", "Tell me"}, {"instructions", "Be brief."}, {"max_output_tokens", 5}});
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.body["object"], "response");
  EXPECT_EQ(a.body["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(a.body["instructions"], "Be brief.");
  const json& msg = a.body["output"][0];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"][0]["type"], "output_text");
  const int first_input = a.body["usage"]["input_tokens"];
  if (a.body["usage"]["output_tokens"] == 5) {
    EXPECT_EQ(a.body["status"], "incomplete");
    EXPECT_EQ(a.body["incomplete_details"]["reason"], "max_output_tokens");
  }
  // A continuation: the stored conversation plus the new input, without the
  // earlier instructions (they are not carried over).
  const std::string id = a.body["id"];
  const Result b = resp({{"input", json::array({{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "More"}}}}}})},
                         {"previous_response_id", id}, {"max_output_tokens", 3}});
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(b.body["previous_response_id"], id);
  EXPECT_GT(b.body["usage"]["input_tokens"].get<int>(), first_input);
  const Result other = resp({{"input", "x"}, {"previous_response_id", id}}, "kb");
  EXPECT_EQ(other.status, 400);
  EXPECT_EQ(other.body["error"]["param"], "previous_response_id");
  // The SDK's responses.retrieve and responses.delete: the object as it was
  // answered, for its own tenant only.
  auto stored = [&](const std::string& method, const std::string& rid, const std::string& key) {
    return drive(rig.api->handle({method, "/v1/responses/" + rid, "Bearer " + key, ""}, [] {}));
  };
  const Result got = stored("GET", id, "ka");
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.body, a.body);
  EXPECT_EQ(stored("GET", id, "kb").status, 404) << "another tenant's response is unknown to it";
  EXPECT_EQ(stored("DELETE", id, "kb").status, 404);
  const Result del = stored("DELETE", id, "ka");
  ASSERT_EQ(del.status, 200) << del.body;
  EXPECT_EQ(del.body["object"], "response.deleted");
  EXPECT_EQ(del.body["deleted"], true);
  const Result gone = stored("GET", id, "ka");
  EXPECT_EQ(gone.status, 404);
  EXPECT_EQ(gone.body["error"]["code"], "response_not_found");
  const Result unstored = resp({{"input", "x"}, {"max_output_tokens", 2}, {"store", false}});
  ASSERT_EQ(unstored.status, 200) << unstored.body;
  EXPECT_EQ(stored("GET", unstored.body["id"], "ka").status, 404) << "store: false keeps nothing";
  // Streamed: the Responses events, in order.
  const Result s = resp({{"input", "Hi"}, {"max_output_tokens", 4}, {"stream", true}});
  ASSERT_EQ(s.status, 200);
  std::vector<std::string> types;
  std::string deltas;
  for (size_t i = 0; i < s.events.size(); ++i) {
    ASSERT_FALSE(s.events[i].is_null()) << "no [DONE] on /v1/responses";
    EXPECT_EQ(s.events[i]["sequence_number"], int(i));
    const std::string t = s.events[i]["type"];
    if (t == "response.output_text.delta") deltas += s.events[i]["delta"].get<std::string>();
    else types.push_back(t);
  }
  const std::string last = s.events.back()["type"];
  EXPECT_TRUE(last == "response.completed" || last == "response.incomplete") << last;
  EXPECT_EQ(types, (std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                              "response.content_part.added", "response.output_text.done",
                                              "response.content_part.done", "response.output_item.done", last}));
  EXPECT_EQ(s.events.back()["response"]["output"][0]["content"][0]["text"], deltas);
  const Result streamed = stored("GET", s.events.back()["response"]["id"], "ka");
  ASSERT_EQ(streamed.status, 200) << "a streamed response is stored too";
  EXPECT_EQ(streamed.body["output"], s.events.back()["response"]["output"]);
  for (const char* k : {"tools", "reasoning", "include"}) {
    json body = {{"input", "x"}};
    body[k] = k == std::string("tools") ? json::array({{{"type", "function"}, {"name", "f"}}})
              : k == std::string("include") ? json::array({"reasoning.encrypted_content"})
                                             : json{{"effort", "high"}};
    EXPECT_EQ(resp(body).body["error"]["param"], k);
  }
}

// Streamed completions logprobs: text_offset counts from the start of the
// choice's whole text, as without streaming (echo too). With include_usage
// every chunk has "usage" (null but in the last); with vLLM's
// continuous_usage_stats it is the count so far.
TEST(ApiService, StreamedOffsetsAndUsageInEveryChunk) {
  Rig rig;
  for (bool echo : {false, true}) {
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 1},
                       {"ignore_eos", true}, {"echo", echo}};
    const Result whole = complete(rig, body);
    ASSERT_EQ(whole.status, 200) << whole.body;
    json streamed_body = body;
    streamed_body["stream"] = true;
    const Result s = complete(rig, streamed_body);
    ASSERT_EQ(s.status, 200);
    json offsets = json::array();
    std::string text;
    for (const json& ev : s.events) {
      if (ev.is_null() || ev["choices"].empty()) continue;
      text += ev["choices"][0]["text"].get<std::string>();
      if (ev["choices"][0]["logprobs"].is_null()) continue;
      for (const json& o : ev["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(o);
    }
    EXPECT_EQ(text, whole.body["choices"][0]["text"]);
    EXPECT_EQ(offsets, whole.body["choices"][0]["logprobs"]["text_offset"]) << "echo " << echo;
  }
  const Result u = complete(rig, {{"prompt", "Once"}, {"max_tokens", 4}, {"ignore_eos", true}, {"stream", true},
                                  {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(u.status, 200);
  ASSERT_GE(u.events.size(), 3u);
  for (size_t i = 0; i + 2 < u.events.size(); ++i) {
    ASSERT_TRUE(u.events[i].contains("usage")) << u.events[i];
    EXPECT_TRUE(u.events[i]["usage"].is_null()) << u.events[i];
  }
  EXPECT_EQ(u.events[u.events.size() - 2]["usage"]["completion_tokens"], 4);
  const Result c = complete(rig, {{"prompt", "Once"}, {"max_tokens", 4}, {"ignore_eos", true}, {"stream", true},
                                  {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}});
  ASSERT_EQ(c.status, 200);
  int last = 0;
  for (size_t i = 0; i + 1 < c.events.size(); ++i) {
    const json& us = c.events[i]["usage"];
    ASSERT_TRUE(us.is_object()) << c.events[i];
    EXPECT_EQ(us["prompt_tokens"], int(rig.tok->encode("Once", true).size()));
    EXPECT_GE(us["completion_tokens"].get<int>(), last);
    EXPECT_EQ(us["total_tokens"], us["prompt_tokens"].get<int>() + us["completion_tokens"].get<int>());
    last = us["completion_tokens"];
  }
  EXPECT_EQ(last, 4);
}

// The field at fault is named: the prompt when it alone fills the context,
// min_tokens over the tokens the context leaves, ids outside the vocabulary.
TEST(ApiService, ErrorsNameTheFieldAtFault) {
  Rig rig;
  const Result big = complete(rig, {{"prompt", std::vector<int>(5000, 100)}});
  ASSERT_EQ(big.status, 400);
  EXPECT_EQ(big.body["error"]["param"], "prompt");
  EXPECT_EQ(big.body["error"]["code"], "context_length_exceeded");
  const std::string m = big.body["error"]["message"];
  EXPECT_NE(m.find("has 5000 tokens"), std::string::npos) << m;
  EXPECT_NE(m.find("holds 4096"), std::string::npos) << m;
  const Result chat = drive(rig.api->handle(
      post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", std::string(5000, 'x')}}}}}), [] {}));
  EXPECT_EQ(chat.body["error"]["param"], "messages");
  // 4090 prompt tokens leave 6 by default.
  const Result mt = complete(rig, {{"prompt", std::vector<int>(4090, 100)}, {"min_tokens", 10}});
  ASSERT_EQ(mt.status, 400);
  EXPECT_EQ(mt.body["error"]["param"], "min_tokens");
  const Result lb = complete(rig, {{"prompt", "x"}, {"logit_bias", {{std::to_string(kVocab), 1}}}});
  ASSERT_EQ(lb.status, 400);
  EXPECT_EQ(lb.body["error"]["param"], "logit_bias");
  EXPECT_EQ(complete(rig, {{"prompt", "x"}, {"stop_token_ids", {kVocab}}}).body["error"]["param"], "stop_token_ids");
  const HttpResponse at =
      rig.api->handle(post("/apply-template", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"foo", 1}}), {})
          .response;
  EXPECT_EQ(at.status, 400);
  const std::string am = json::parse(at.body)["error"]["message"];
  EXPECT_NE(am.find("/apply-template"), std::string::npos) << am;
  EXPECT_EQ(am.find("/v1/chat"), std::string::npos) << am;
}

// A route answers the methods it has; others get 405 with Allow.
TEST(ApiService, MethodsAre405WithAllow) {
  Rig rig;
  auto call = [&](const std::string& method, const std::string& path) {
    return rig.api->handle({method, path, "", ""}, {}).response;
  };
  auto allow = [](const HttpResponse& r) {
    for (const auto& [k, v] : r.headers)
      if (k == "Allow") return v;
    return std::string("(none)");
  };
  for (const auto& [method, path, allowed] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GET", "/v1/completions", "POST"},
           {"GET", "/v1/chat/completions", "POST"},
           {"GET", "/tokenize", "POST"},
           {"POST", "/v1/models", "GET"},
           {"DELETE", "/v1/models", "GET"},
           {"POST", "/metrics", "GET"},
           {"DELETE", "/health", "GET, HEAD"},
           {"POST", "/health", "GET, HEAD"},
           {"PUT", "/health", "GET, HEAD"},
           {"POST", "/v1/responses/resp_x", "GET, DELETE"}}) {
    const HttpResponse r = call(method, path);
    EXPECT_EQ(r.status, 405) << method << " " << path;
    EXPECT_EQ(allow(r), allowed) << method << " " << path;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "method_not_allowed");
  }
  EXPECT_EQ(call("GET", "/health").status, 200);
  EXPECT_EQ(call("HEAD", "/health").status, 200);
  EXPECT_EQ(call("GET", "/v1/models").status, 200);
  EXPECT_EQ(call("POST", "/nope").status, 404);
  // The SDK's models.retrieve.
  const HttpResponse one = call("GET", "/v1/models/fake");
  ASSERT_EQ(one.status, 200);
  EXPECT_EQ(json::parse(one.body)["id"], "fake");
  EXPECT_EQ(json::parse(call("GET", "/v1/models/other").body)["error"]["code"], "model_not_found");
  EXPECT_EQ(call("DELETE", "/v1/models/fake").status, 405);
}

// /apply-template takes vLLM's add_generation_prompt (default true): false
// renders the conversation without the assistant turn's opening (it was a
// 400, unknown field). A non-boolean is a 400 naming it.
TEST(ApiService, ApplyTemplateTakesAddGenerationPrompt) {
  Rig rig;
  const json msgs = {{{"role", "user"}, {"content", "hi"}}};
  auto apply = [&](const json& body) { return rig.api->handle(post("/apply-template", body), {}).response; };
  const HttpResponse with = apply({{"messages", msgs}});
  ASSERT_EQ(with.status, 200) << with.body;
  EXPECT_EQ(json::parse(with.body)["prompt"], "user: hi\nassistant:");
  EXPECT_EQ(json::parse(apply({{"messages", msgs}, {"add_generation_prompt", true}}).body)["prompt"],
            "user: hi\nassistant:");
  const HttpResponse without = apply({{"messages", msgs}, {"add_generation_prompt", false}});
  ASSERT_EQ(without.status, 200) << without.body;
  EXPECT_EQ(json::parse(without.body)["prompt"], "user: hi\n");
  const HttpResponse bad = apply({{"messages", msgs}, {"add_generation_prompt", "no"}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(json::parse(bad.body)["error"]["param"], "add_generation_prompt");
  // The chat endpoint's generation always opens the assistant turn.
  EXPECT_EQ(drive(rig.api->handle(post("/v1/chat/completions", {{"messages", msgs}, {"add_generation_prompt", false}}),
                                  [] {}))
                .status,
            400);
}
