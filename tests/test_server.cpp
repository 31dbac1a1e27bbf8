// kvserve serve over real sockets on 127.0.0.1: a raw HTTP client (framing,
// malformed input), curl (SSE), the official OpenAI Node SDK, tenant
// isolation of the prefix cache, 429 backpressure, disconnects, 256
// concurrent streams and graceful SIGTERM.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "http_client.h"
#include "kvs_process.h"
#include "sched/clock.h"
#include "server/tenants.h"
#include "test_util.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using kvs::sched::steady_now;
using kvs::server::sha256_hex;
using kvs::test::connect_local;
using kvs::test::send_all;

std::string stories() { return kvs::test::shared("models/stories260K/stories260K.gguf"); }
std::string tiny_llama() { return kvs::test::shared("models/tiny-random/tiny-llama-f16.gguf"); }

// A kvserve serve child with two compute threads.
struct Server : kvs::test::ServeProcess {
  explicit Server(std::vector<std::string> args) : ServeProcess(with_threads(std::move(args))) {}
  static std::vector<std::string> with_threads(std::vector<std::string> args) {
    args.insert(args.begin(), {"--threads", "2"});
    return args;
  }
};

// A reply with its body read as JSON.
struct Reply : kvs::test::HttpReply {
  Reply() = default;
  Reply(kvs::test::HttpReply r) : HttpReply(std::move(r)) {}
  json js() const { return json::parse(body); }
  std::vector<json> events() const {  // SSE data objects; "[DONE]" -> null
    std::vector<json> v;
    for (const std::string& d : kvs::test::sse_payloads(body))
      v.push_back(d == "[DONE]" ? json(nullptr) : json::parse(d));
    return v;
  }
};

// `authorization`: the header's whole value ("" = none).
Reply request_auth(int port, const std::string& method, const std::string& path, const std::string& body,
                   const std::string& authorization) {
  std::map<std::string, std::string> h;
  if (!authorization.empty()) h["Authorization"] = authorization;
  return kvs::test::http_request(port, method, path, body, h);
}

// `stop_after_chunks` > 0: hang up after that many chunks (a client that
// goes away).
Reply request(int port, const std::string& method, const std::string& path, const std::string& body = "",
              const std::string& key = "", int stop_after_chunks = 0) {
  int seen = 0;
  const kvs::test::ChunkFn stop = [&](const std::string&) { return ++seen < stop_after_chunks; };
  return kvs::test::http_request(port, method, path, body, kvs::test::bearer(key), 120, 0,
                                 stop_after_chunks > 0 ? stop : nullptr);
}

Reply post(int port, const std::string& path, const json& body, const std::string& key = "") {
  return request(port, "POST", path, body.dump(), key);
}

double metric(int port, const std::string& name) { return kvs::test::metric_value(port, name); }

// Text of roughly n tokens for stories260K (each word ~1-2 tokens).
std::string words(int n, int salt = 0) {
  static const char* w[] = {"the", "cat", "dog", "sun", "tree", "house", "river", "small", "big", "happy",
                            "park", "ball", "friend", "mom", "little", "girl", "boy", "bird", "fish", "cake"};
  std::string s;
  for (int i = 0; i < n; ++i) s += std::string(i ? " " : "") + w[(i * 7 + salt * 3 + i / 5) % 20];
  return s;
}

#define REQUIRE_SHARED()                                                   \
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared is not available"

}  // namespace

TEST(Server, HealthModelsMetricsAndRoutes) {
  REQUIRE_SHARED();
  Server s({"-m", stories()});
  EXPECT_EQ(request(s.port(), "GET", "/health").status, 200);
  const Reply m = request(s.port(), "GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.js()["data"][0]["id"], "stories260K");
  const Reply mt = request(s.port(), "GET", "/metrics");
  ASSERT_EQ(mt.status, 200);
  for (const char* name :
       {"kvserve_requests_total", "kvserve_requests_rejected_total", "kvserve_running_requests",
        "kvserve_queue_depth{class=\"interactive\"}", "kvserve_kv_blocks_total", "kvserve_kv_blocks_free",
        "kvserve_kv_blocks_cached", "kvserve_kv_blocks_used", "kvserve_kv_usage_ratio",
        "kvserve_prefix_cache_queries_tokens_total", "kvserve_prefix_cache_hits_tokens_total",
        "kvserve_preemptions_total", "kvserve_time_to_first_token_seconds_bucket",
        "kvserve_time_per_output_token_seconds_count", "kvserve_e2e_request_latency_seconds_sum",
        "kvserve_prompt_tokens_total", "kvserve_generation_tokens_total"})
    EXPECT_NE(mt.body.find(name), std::string::npos) << name;
  EXPECT_EQ(request(s.port(), "GET", "/nope").status, 404);
  const Reply unk = post(s.port(), "/v1/completions", {{"model", "gpt-4"}, {"prompt", "hi"}});
  EXPECT_EQ(unk.status, 404);
  EXPECT_EQ(unk.js()["error"]["code"], "model_not_found");
  EXPECT_EQ(s.stop(), 0);
}

// The OpenAI conformance defects over real sockets: /v1/models
// behind the keys with a real "created", the bearer scheme in any case,
// several prompts per request, echo, refusal and system_fingerprint, plain
// JSON error text, and the log line of every rejection (tenant hash only).
TEST(Server, OpenAiConformanceOverHttp) {
  REQUIRE_SHARED();
  const std::string keys = kvs::test::temp_dir() + "/conf-keys.json";
  std::ofstream(keys) << json{{"keys", {{{"key_sha256", sha256_hex("conf-key")}, {"tenant", "conf"}}}}}.dump();
  Server s({"-m", stories(), "--api-keys", keys});
  const int port = s.port();
  EXPECT_EQ(request(port, "GET", "/v1/models").status, 401);
  const Reply m = request_auth(port, "GET", "/v1/models", "", "bearer conf-key");
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_GT(m.js()["data"][0]["created"].get<int64_t>(), 1000000000);
  const Reply lower = request_auth(port, "POST", "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 2}}.dump(),
                                   "bearer conf-key");
  EXPECT_EQ(lower.status, 200) << lower.body;

  const Reply multi = post(port, "/v1/completions",
                           {{"prompt", {"Once upon a time", "The cat"}}, {"n", 2}, {"max_tokens", 8}, {"temperature", 0}},
                           "conf-key");
  ASSERT_EQ(multi.status, 200) << multi.body;
  const json mj = multi.js();
  ASSERT_EQ(mj["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(mj["choices"][i]["index"], i);
  EXPECT_EQ(mj["choices"][0]["text"], mj["choices"][1]["text"]);
  EXPECT_NE(mj["choices"][0]["text"], mj["choices"][2]["text"]);
  EXPECT_TRUE(mj["system_fingerprint"].is_string());

  const Reply echo = post(port, "/v1/completions", {{"prompt", "Once upon a time"}, {"echo", true}, {"max_tokens", 4}},
                          "conf-key");
  ASSERT_EQ(echo.status, 200);
  EXPECT_EQ(echo.js()["choices"][0]["text"].get<std::string>().rfind("Once upon a time", 0), 0u);

  const Reply chat = post(port, "/v1/chat/completions",
                          {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}, {"logprobs", true}},
                          "conf-key");
  ASSERT_EQ(chat.status, 200);
  const json cj = chat.js();
  EXPECT_TRUE(cj["choices"][0]["message"].contains("refusal"));
  EXPECT_TRUE(cj["choices"][0]["logprobs"].contains("refusal"));
  EXPECT_TRUE(cj["system_fingerprint"].is_string());

  const Reply bad = request(port, "POST", "/v1/completions", "{\"prompt\": \"hidden words\" x}", "conf-key");
  ASSERT_EQ(bad.status, 400);
  const std::string msg = bad.js()["error"]["message"];
  EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte"), std::string::npos) << msg;
  EXPECT_EQ(request(port, "POST", "/v1/completions", json{{"prompt", "x"}, {"priority", "batch"}}.dump(), "conf-key")
                .js()["error"]["param"],
            "priority");
  s.stop();
  const std::string log = s.log();
  const std::string hash = sha256_hex("kvserve-tenant:conf").substr(0, 16);
  EXPECT_NE(log.find("id=- tenant=" + hash + " status=400"), std::string::npos) << log;
  EXPECT_EQ(log.find("hidden words"), std::string::npos);
}

TEST(Server, GreedyOutputEqualsGenerateOnGoldens) {
  REQUIRE_SHARED();
  Server s({"-m", stories()});
  for (const char* g : {"once", "cat", "park", "long"}) {
    const json gold = json::parse(kvs::test::read_file(kvs::test::shared(std::string("golden/stories260K/") + g + ".json")));
    const std::string prompt = gold["prompt"];
    // run.c emits a token at positions P-1 .. steps-1: steps - P + 1 tokens
    // (fewer when the model ends the story), within the 512-token context.
    const int P = int(gold["prompt_tokens"].size());
    const int n = std::min(int(gold["steps"]) - P + 1, 512 - P);
    std::string out;
    ASSERT_EQ(kvs::test::run_kvserve({"generate", "-m", stories(), "-p", prompt, "-n", std::to_string(n), "--temp", "0",
                                      "--json"},
                                     &out),
              0);
    const json gen = json::parse(out);
    const Reply r = post(s.port(), "/v1/completions",
                         {{"model", "stories260K"}, {"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}});
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = r.js();
    EXPECT_EQ(j["choices"][0]["text"], gen["text"]) << g;
    EXPECT_EQ(j["usage"]["prompt_tokens"], gold["prompt_tokens"].size()) << g;
    // The golden lists the BOS that ended the story; it is not a completion token.
    const size_t gen_n = gold["generated"].size() - (gold["generated"].back() == 1 ? 1 : 0);
    EXPECT_EQ(j["usage"]["completion_tokens"], gen_n) << g;
    // Streamed: the same text, chunk by chunk, then [DONE].
    const Reply st = post(s.port(), "/v1/completions",
                          {{"model", "stories260K"}, {"prompt", prompt}, {"max_tokens", n}, {"temperature", 0},
                           {"stream", true}});
    ASSERT_EQ(st.status, 200);
    EXPECT_EQ(st.headers.at("content-type"), "text/event-stream");
    std::string text;
    const auto ev = st.events();
    ASSERT_FALSE(ev.empty());
    EXPECT_TRUE(ev.back().is_null());
    for (const auto& e : ev)
      if (!e.is_null()) text += e["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(text, gen["text"]) << g;
  }
  // No prompt text in the logs.
  EXPECT_EQ(s.stop(), 0);
  EXPECT_EQ(s.log().find("Once upon a time"), std::string::npos);
}

TEST(Server, CurlSseFraming) {
  REQUIRE_SHARED();
  if (std::system("curl --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "curl is not installed";
  Server s({"-m", stories()});
  const std::string dir = kvs::test::temp_dir();
  // Greedy: a sampled first token is end-of-text about once in a thousand
  // runs, and this test counts the chunks of a full-length reply.
  const std::string cmd = "curl -sS -N -D " + dir + "/h.txt -o " + dir + "/b.txt " + s.url() +
                          "/v1/chat/completions -H 'Content-Type: application/json' -d "
                          "'{\"model\":\"stories260K\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"Tell a story\"}],"
                          "\"max_tokens\":20,\"stream\":true,\"stream_options\":{\"include_usage\":true}}'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string h = kvs::test::read_file(dir + "/h.txt"), b = kvs::test::read_file(dir + "/b.txt");
  EXPECT_NE(h.find("text/event-stream"), std::string::npos);
  EXPECT_NE(h.find("chunked"), std::string::npos);
  // Every event is "data: {json}\n\n"; the last is [DONE]; the one before carries usage.
  ASSERT_GE(b.size(), 14u);
  EXPECT_EQ(b.substr(b.size() - 14), "data: [DONE]\n\n");
  std::vector<json> ev;
  size_t p = 0;
  while (p < b.size()) {
    const size_t e = b.find("\n\n", p);
    ASSERT_NE(e, std::string::npos);
    ASSERT_EQ(b.compare(p, 6, "data: "), 0);
    const std::string d = b.substr(p + 6, e - p - 6);
    if (d != "[DONE]") ev.push_back(json::parse(d));
    p = e + 2;
  }
  ASSERT_GE(ev.size(), 3u) << b;
  EXPECT_EQ(ev[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(ev.back()["choices"].empty());
  EXPECT_EQ(ev.back()["usage"]["completion_tokens"], 20);
  EXPECT_TRUE(ev.back()["usage"]["prompt_tokens_details"].contains("cached_tokens"));
  EXPECT_EQ(ev[ev.size() - 2]["choices"][0]["finish_reason"], "length");
}

// The official OpenAI Node SDK (tests/sdk/sdk_test.mjs) against two
// servers: one under --api-keys (completions, chat, models, 400/401/404 and
// the tenant-quota 429), one with room for a single sequence and a single
// waiting request (queue-full 429, abort mid-stream). Node and npm are
// required (scripts/deps.sh installs them): without them this fails.
TEST(Server, OpenAiSdkConformance) {
  REQUIRE_SHARED();
  ASSERT_EQ(std::system("node --version > /dev/null 2>&1 && npm --version > /dev/null 2>&1"), 0)
      << "node and npm are required for the OpenAI SDK conformance test (bash scripts/deps.sh installs them)";
  const fs::path src = fs::path(__FILE__).parent_path() / "sdk";
  const fs::path dir = fs::path(KVS_BINARY).parent_path() / "sdk-test";
  fs::create_directories(dir);
  fs::copy_file(src / "package.json", dir / "package.json", fs::copy_options::overwrite_existing);
  fs::copy_file(src / "sdk_test.mjs", dir / "sdk_test.mjs", fs::copy_options::overwrite_existing);
  if (!fs::exists(dir / "node_modules" / "openai" / "package.json")) {
    const std::string cmd = "cd '" + dir.string() +
                            "' && timeout 600 npm install --no-audit --no-fund --no-package-lock --loglevel=error "
                            "> npm.log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "npm install openai@6 failed:\n" << kvs::test::read_file(dir / "npm.log");
  }
  const std::string keys = kvs::test::temp_dir() + "/sdk-keys.json";
  std::ofstream(keys) << json{{"keys",
                               {{{"key_sha256", sha256_hex("sdk-key")}, {"tenant", "sdk"}},
                                {{"key_sha256", sha256_hex("sdk-quota-key")}, {"tenant", "small"}, {"quota_blocks", 1}}}}}
                             .dump();
  Server s({"-m", stories(), "--api-keys", keys});
  Server q({"-m", tiny_llama(), "--ctx", "2048", "--max-seqs", "1", "--max-queue", "1", "--max-request-share", "1",
            "--interactive-wait", "120"});
  Server t({"-m", kvs::test::shared("models/tiny-random/tiny-qwen2-q8_0.gguf"), "--ctx", "1024", "--chat-template",
            kvs::test::shared("chat-templates/Qwen-Qwen3-0.6B.jinja")});
  const std::string cmd = "cd '" + dir.string() + "' && timeout 600 node sdk_test.mjs " + s.url() +
                          " stories260K sdk-key sdk-quota-key " + q.url() + " tiny-llama-f16 " + t.url() +
                          " tiny-qwen2-q8_0 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SDK OK"), std::string::npos) << "the script did not finish (output above)";
  EXPECT_EQ(s.stop(), 0);
  EXPECT_EQ(q.stop(), 0);
  EXPECT_EQ(t.stop(), 0);
}

TEST(Server, MalformedInputCorpus) {
  REQUIRE_SHARED();
  Server s({"-m", stories(), "--header-timeout", "2", "--body-timeout", "2", "--body-limit", "1MiB"});
  const int port = s.port();
  struct Case {
    std::string body;
    int status;
  };
  const std::string bad_utf8 = std::string("{\"model\":\"stories260K\",\"prompt\":\"a\xff\xfe b\"}");
  const std::vector<Case> cases = {
      {"{", 400},
      {"not json", 400},
      {"[]", 400},
      {"{\"prompt\": 5}", 400},
      {"{\"prompt\": \"x\", \"max_tokens\": \"ten\"}", 400},
      {"{\"prompt\": \"x\", \"max_tokens\": -1}", 400},
      {"{\"prompt\": \"x\", \"max_tokens\": 1e300}", 400},
      {"{\"prompt\": \"x\", \"temperature\": \"hot\"}", 400},
      {"{\"prompt\": \"x\", \"temperature\": 9}", 400},
      {"{\"prompt\": \"x\", \"n\": 1000}", 400},
      {"{\"prompt\": \"x\", \"stop\": [1, 2]}", 400},
      {"{\"prompt\": \"x\", \"stream\": \"yes\"}", 400},
      {"{\"prompt\": \"x\", \"logprobs\": 99}", 400},
      {"{\"prompt\": []}", 400},
      {"{\"prompt\": [\"a\", 1]}", 400},
      {"{\"prompt\": \"x\", \"priority\": \"batch\"}", 400},
      {"{\"prompt\": [-5]}", 400},
      {"{\"prompt\": [99999999]}", 400},
      {"{\"prompt\": \"x\", \"max_tokens\": 100000}", 400},
      {bad_utf8, 400},
      {"{\"prompt\": \"" + std::string(600000, 'a') + "\"}", 400},  // over the context
      {"{\"prompt\": \"" + std::string(2 << 20, 'a') + "\"}", 413},  // over the body limit
      {std::string(100, '{'), 400},
  };
  for (const auto& c : cases) {
    const Reply r = request(port, "POST", "/v1/completions", c.body);
    EXPECT_EQ(r.status, c.status) << c.body.substr(0, 80);
    if (r.status == 400) {
      EXPECT_TRUE(r.js()["error"].contains("message"));
      EXPECT_EQ(r.js()["error"]["type"], "invalid_request_error");
    }
  }
  const Reply ctx = post(port, "/v1/completions", {{"prompt", words(300)}, {"max_tokens", 400}});
  EXPECT_EQ(ctx.status, 400);
  EXPECT_EQ(ctx.js()["error"]["code"], "context_length_exceeded");
  const Reply chat = post(port, "/v1/chat/completions", {{"messages", "hi"}});
  EXPECT_EQ(chat.status, 400);
  // Raw protocol abuse: garbage, a huge header, slowloris (a head that
  // never ends), a body shorter than announced. Each ends in a 4xx or a
  // closed connection, never a crash.
  for (const std::string& raw :
       {std::string("GARBAGE\r\n\r\n"), std::string("GET / HTTP/1.1\r\nX: ") + std::string(100000, 'x') + "\r\n\r\n",
        std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len"),
        std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")}) {
    const int fd = connect_local(port, 10);
    ASSERT_GE(fd, 0);
    send_all(fd, raw);
    const double t0 = steady_now();
    char buf[4096];
    std::string got;
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, size_t(n));
    close(fd);
    EXPECT_LT(steady_now() - t0, 8.0) << "the server must cut slow or broken requests off";
    if (!got.empty()) {
      EXPECT_EQ(got.substr(0, 9), "HTTP/1.1 ");
      EXPECT_EQ(got[9], '4') << got.substr(0, 40);
    }
  }
  // Many slowloris connections at once do not block a normal request.
  std::vector<int> slow;
  for (int i = 0; i < 50; ++i) {
    const int fd = connect_local(port);
    send_all(fd, "POST /v1/completions HTTP/1.1\r\n");
    slow.push_back(fd);
  }
  const Reply ok = post(port, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}});
  EXPECT_EQ(ok.status, 200);
  for (int fd : slow) close(fd);
  EXPECT_TRUE(s.alive());
  EXPECT_EQ(request(port, "GET", "/health").status, 200);
  EXPECT_EQ(s.stop(), 0);
}

TEST(Server, TenantIsolationOfThePrefixCache) {
  REQUIRE_SHARED();
  const std::string dir = kvs::test::temp_dir();
  {
    std::ofstream f(dir + "/keys.json");
    f << json{{"keys",
               {{{"key_sha256", sha256_hex("key-a")}, {"tenant", "a"}, {"permission_version", 1}},
                {{"key_sha256", sha256_hex("key-b")}, {"tenant", "b"}, {"permission_version", 1}},
                {{"key_sha256", sha256_hex("key-admin")}, {"tenant", "ops"}, {"admin", true}}}}}
             .dump();
  }
  // tiny-llama (32k vocab, 4 layers): a 500-token prefill costs tens of ms,
  // a cached one almost nothing, so TTFT shows whether a request hit.
  Server s({"-m", tiny_llama(), "--api-keys", dir + "/keys.json", "--ctx", "1024"});
  const int port = s.port();
  EXPECT_EQ(post(port, "/v1/completions", {{"prompt", "x"}}).status, 401);
  EXPECT_EQ(post(port, "/v1/completions", {{"prompt", "x"}}, "wrong").status, 401);

  // Find a text of ~500 tokens. The search runs as a third tenant (ops), so
  // what it caches is invisible to a and b.
  std::string prompt;
  int P = 0;
  for (int n = 200; n < 2000 && P < 500; n += 20) {
    prompt = words(n, 1);
    const Reply r = post(port, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}}, "key-admin");
    ASSERT_EQ(r.status, 200) << r.body;
    P = r.js()["usage"]["prompt_tokens"];
  }
  auto run = [&](const std::string& key, double* ttft) {
    const double t0 = steady_now();
    const Reply r = request(port, "POST", "/v1/completions",
                            json{{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}, {"stream", true},
                                 {"stream_options", {{"include_usage", true}}}}
                                .dump(),
                            key);
    EXPECT_EQ(r.status, 200);
    *ttft = r.chunk_times.empty() ? 1e9 : r.chunk_times.front() - t0;
    const auto ev = r.events();
    return ev.size() >= 2 ? ev[ev.size() - 2]["usage"] : json();
  };
  double t_a1, t_a2, t_b, t_a3;
  const double prefill0 = metric(port, "kvserve_prefill_tokens_total");
  const json a1 = run("key-a", &t_a1);
  EXPECT_EQ(a1["prompt_tokens_details"]["cached_tokens"], 0);
  const json a2 = run("key-a", &t_a2);
  EXPECT_GT(a2["prompt_tokens_details"]["cached_tokens"].get<int>(), int(a2["prompt_tokens"]) - 20);
  const double prefill1 = metric(port, "kvserve_prefill_tokens_total");
  const json b = run("key-b", &t_b);
  EXPECT_EQ(b["prompt_tokens_details"]["cached_tokens"], 0);
  const double prefill2 = metric(port, "kvserve_prefill_tokens_total");
  EXPECT_GE(prefill2 - prefill1, double(b["prompt_tokens"].get<int>())) << "B must prefill the whole prompt";
  EXPECT_GT(t_b, 2.5 * t_a2) << "B's TTFT must not show A's hit (B " << t_b << " s, A cached " << t_a2 << " s)";
  (void)prefill0;
  // Revoke A: its old blocks miss from now on, and are dropped at once.
  EXPECT_EQ(post(port, "/admin/tenants/a/revoke", json::object(), "key-a").status, 403);
  const std::string dropped_revoke = "kvserve_prefix_cache_dropped_blocks_total{reason=\"revoke\"}";
  EXPECT_EQ(metric(port, dropped_revoke), 0);
  const double cached0 = metric(port, "kvserve_kv_blocks_cached"), free0 = metric(port, "kvserve_kv_blocks_free");
  const Reply rv = post(port, "/admin/tenants/a/revoke", json::object(), "key-admin");
  ASSERT_EQ(rv.status, 200) << rv.body;
  EXPECT_EQ(rv.js()["permission_version"], 2);
  // A's prompt filled P / 16 full blocks (block size 16), all cached.
  const int a_blocks = a1["prompt_tokens"].get<int>() / 16;
  EXPECT_GE(rv.js()["dropped_blocks"].get<int>(), a_blocks) << rv.body;
  EXPECT_EQ(metric(port, dropped_revoke), rv.js()["dropped_blocks"].get<double>());
  EXPECT_EQ(metric(port, "kvserve_kv_blocks_cached"), cached0 - rv.js()["dropped_blocks"].get<double>());
  EXPECT_EQ(metric(port, "kvserve_kv_blocks_free"), free0 + rv.js()["dropped_blocks"].get<double>());
  const json a3 = run("key-a", &t_a3);
  EXPECT_EQ(a3["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(s.stop(), 0);
  const std::string log = s.log();
  EXPECT_EQ(log.find(prompt.substr(0, 40)), std::string::npos) << "prompt text leaked into the log";
  EXPECT_EQ(log.find("key-a"), std::string::npos);
  EXPECT_EQ(log.find("tenant=a "), std::string::npos);
}

TEST(Server, RetentionDropsATenantsCachedBlocks) {
  REQUIRE_SHARED();
  const std::string dir = kvs::test::temp_dir();
  {
    std::ofstream f(dir + "/keys.json");
    f << json{{"keys",
               {{{"key_sha256", sha256_hex("key-r")}, {"tenant", "r"}, {"retention_s", 1}},
                {{"key_sha256", sha256_hex("key-k")}, {"tenant", "k"}}}}}
             .dump();
  }
  Server s({"-m", stories(), "--api-keys", dir + "/keys.json"});
  const int port = s.port();
  const std::string dropped = "kvserve_prefix_cache_dropped_blocks_total{reason=\"retention\"}";
  auto run = [&](const std::string& key) {
    const Reply r = post(port, "/v1/completions", {{"prompt", words(60)}, {"max_tokens", 2}, {"temperature", 0}}, key);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.js()["usage"];
  };
  run("key-k");  // a tenant without retention: its blocks stay
  const double cached_k = metric(port, "kvserve_kv_blocks_cached");
  EXPECT_GT(cached_k, 0);
  const json r1 = run("key-r");
  const json r2 = run("key-r");
  EXPECT_GT(r2["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << "within retention_s it hits";
  EXPECT_EQ(metric(port, "kvserve_kv_blocks_cached"), 2 * cached_k);
  EXPECT_EQ(metric(port, dropped), 0);
  // Unused for longer than retention_s (1 s): the sweep (every second) drops
  // r's blocks, and only r's.
  const double t0 = steady_now();
  while (metric(port, dropped) <= 0 && steady_now() - t0 < 6)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GE(steady_now() - t0, 0.8);
  EXPECT_EQ(metric(port, dropped), cached_k);
  EXPECT_EQ(metric(port, "kvserve_kv_blocks_cached"), cached_k);
  const json r3 = run("key-r");
  EXPECT_EQ(r3["prompt_tokens_details"]["cached_tokens"], 0) << "after retention_s an identical request misses";
  const json k2 = run("key-k");
  EXPECT_GT(k2["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  (void)r1;
  EXPECT_EQ(s.stop(), 0);
}

// An int8 cache with 4 sinks + a 64-token window: a 1,000-token generation
// fits a pool that could not hold it without the window (admission counts
// the window's live cap, not prompt + max_tokens).
TEST(Server, QuantizedWindowedCacheServesLongGenerations) {
  REQUIRE_SHARED();
  const std::vector<std::string> common{"-m", stories(), "--ctx", "2048", "--kv-memory", "512KiB", "--max-batch-tokens",
                                        "64", "--kv-type", "int8"};
  const json body{{"prompt", words(40)}, {"max_tokens", 1000}, {"ignore_eos", true}, {"temperature", 0}};
  {
    std::vector<std::string> a = common;
    for (const char* x : {"--kv-window", "64", "--kv-sinks", "4"}) a.push_back(x);
    Server s(a);
    const Reply r = post(s.port(), "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.js()["usage"]["completion_tokens"], 1000);
    EXPECT_LE(metric(s.port(), "kvserve_kv_blocks_total"), 90);
    EXPECT_EQ(metric(s.port(), "kvserve_kv_blocks_used"), 0);
    EXPECT_NE(s.ready_line().find("KV int8"), std::string::npos) << s.ready_line();
    EXPECT_NE(s.ready_line().find("4 sinks + window 64"), std::string::npos);
    EXPECT_EQ(s.stop(), 0);
  }
  // Without the window one 2,048-token sequence would not fit the pool: the
  // server refuses the configuration at start-up, saying why.
  try {
    Server s(common);
    ADD_FAILURE() << "started without a window on a pool smaller than one context";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("KV budget too small"), std::string::npos) << e.what();
  }
}

TEST(Server, FloodGets429WithRetryAfterAndNothingIsLost) {
  REQUIRE_SHARED();
  Server s({"-m", stories(), "--max-seqs", "2", "--max-queue", "4", "--interactive-wait", "2", "--kv-memory", "4MiB"});
  const int port = s.port();
  const int N = 48;
  std::vector<Reply> res(static_cast<size_t>(N));
  std::vector<std::thread> th;
  for (int i = 0; i < N; ++i)
    th.emplace_back([&, i] {
      res[size_t(i)] = post(port, "/v1/completions",
                            {{"prompt", words(40, i)}, {"max_tokens", 64}, {"ignore_eos", true}, {"stream", i % 2 == 0}});
    });
  for (auto& t : th) t.join();
  int ok = 0, busy = 0;
  for (const Reply& r : res) {
    if (r.status == 200) ++ok;
    if (r.status == 429) {
      ++busy;
      ASSERT_TRUE(r.headers.count("retry-after"));
      EXPECT_GE(std::stoi(r.headers.at("retry-after")), 1);
      EXPECT_EQ(r.js()["error"]["type"], "rate_limit_error");
    }
  }
  EXPECT_EQ(ok + busy, N) << "every request ends as 200 or 429";
  EXPECT_GT(ok, 0);
  EXPECT_GT(busy, 0);
  EXPECT_TRUE(s.alive());
  EXPECT_GT(metric(port, "kvserve_requests_total{status=\"429\"}"), 0);
  EXPECT_EQ(s.stop(), 0);
}

TEST(Server, DisconnectMidStreamFreesBlocks) {
  REQUIRE_SHARED();
  Server s({"-m", tiny_llama(), "--ctx", "2048"});
  const int port = s.port();
  const double free0 = metric(port, "kvserve_kv_blocks_used");
  EXPECT_EQ(free0, 0);
  const Reply r = request(port, "POST", "/v1/completions",
                          json{{"prompt", words(50)}, {"max_tokens", 1900}, {"ignore_eos", true}, {"stream", true}}.dump(),
                          "", 5);
  ASSERT_EQ(r.status, 200);
  // The client is gone (request() closed the socket after 5 chunks).
  const double t0 = steady_now();
  double used = -1;
  while (steady_now() - t0 < 5) {
    used = metric(port, "kvserve_kv_blocks_used");
    if (used == 0 && metric(port, "kvserve_running_requests") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(used, 0) << "the aborted sequence's blocks must be freed";
  EXPECT_GE(metric(port, "kvserve_client_disconnects_total"), 1);
  EXPECT_LT(metric(port, "kvserve_generation_tokens_total"), 1900);
  EXPECT_EQ(s.stop(), 0);
  // The access log shows what the request really used, not zeros.
  std::smatch m;
  const std::string log = s.log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("prompt_tokens=([0-9]+) .*completion_tokens=([0-9]+).* client_gone")))
      << log;
  EXPECT_GT(std::stoi(m[1]), 40);
  EXPECT_GE(std::stoi(m[2]), 5);
}

TEST(Server, ManyConcurrentStreams) {
  REQUIRE_SHARED();
  const int N = 256;
  Server s({"-m", stories(), "--max-seqs", "256", "--max-queue", "512", "--kv-memory", "512MiB",
            "--max-request-share", "0.05", "--http-threads", "4"});
  const int port = s.port();
  std::vector<Reply> res(static_cast<size_t>(N));
  std::vector<double> t0(static_cast<size_t>(N));
  std::vector<std::thread> th;
  std::atomic<bool> done{false};
  double peak_streams = 0;
  std::thread sampler([&] {
    while (!done) {
      peak_streams = std::max(peak_streams, metric(port, "kvserve_open_streams"));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  for (int i = 0; i < N; ++i)
    th.emplace_back([&, i] {
      t0[size_t(i)] = steady_now();
      res[size_t(i)] = request(port, "POST", "/v1/completions",
                               json{{"prompt", words(8, i)}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true},
                                    {"temperature", 0.8}, {"seed", i}}
                                   .dump());
    });
  for (auto& t : th) t.join();
  done = true;
  sampler.join();
  int ok = 0;
  double worst_gap = 0;
  for (int i = 0; i < N; ++i) {
    const Reply& r = res[size_t(i)];
    if (r.status != 200) continue;
    ++ok;
    const auto ev = r.events();
    int text_chunks = 0;
    for (const auto& e : ev)
      if (!e.is_null() && !e["choices"][0]["text"].get<std::string>().empty()) ++text_chunks;
    EXPECT_GE(text_chunks, 250);
    for (size_t k = 1; k < r.chunk_times.size(); ++k) worst_gap = std::max(worst_gap, r.chunk_times[k] - r.chunk_times[k - 1]);
  }
  EXPECT_EQ(ok, N);
  EXPECT_GE(peak_streams, N * 0.9) << "streams must be open at the same time";
  EXPECT_LT(worst_gap, 10.0) << "token flow must not stall";
  std::printf("256 streams: peak open %g, worst gap between chunks %.3f s\n", peak_streams, worst_gap);
  EXPECT_EQ(s.stop(), 0);
}

TEST(Server, SigtermDrainsStreamsAndExitsZero) {
  REQUIRE_SHARED();
  Server s({"-m", tiny_llama(), "--ctx", "2048", "--shutdown-timeout", "1"});
  const int port = s.port();
  Reply r;
  std::thread t([&] {
    r = request(port, "POST", "/v1/completions",
                json{{"prompt", words(20)}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump());
  });
  // Wait until it streams, then SIGTERM: within the timeout the stream is
  // ended (finish_reason abort, [DONE]) and the process exits 0.
  const double t0 = steady_now();
  while (metric(port, "kvserve_running_requests") < 1 && steady_now() - t0 < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(s.stop(20), 0);
  t.join();
  ASSERT_EQ(r.status, 200);
  const auto ev = r.events();
  ASSERT_GE(ev.size(), 2u);
  EXPECT_TRUE(ev.back().is_null());
  EXPECT_FALSE(ev[ev.size() - 2]["choices"][0]["finish_reason"].is_null());
}

// llama-server's token endpoints: /tokenize as `kvserve tokenize`, with
// pieces; /detokenize back to the text; /apply-template the prompt a chat
// request is fed; bad input and unknown fields are 400s.
TEST(Server, TokenizeDetokenizeApplyTemplate) {
  REQUIRE_SHARED();
  Server s({"-m", stories()});
  const std::string text = "Once upon a time, a little cat";
  std::string out;
  ASSERT_EQ(kvs::test::run_kvserve({"tokenize", "-m", stories(), "-p", text, "--json"}, &out), 0);
  const json cli = json::parse(out);
  Reply r = post(s.port(), "/tokenize", {{"content", text}, {"add_special", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json ids = r.js()["tokens"];
  EXPECT_EQ(ids, cli["tokens"]) << out;
  r = post(s.port(), "/tokenize", {{"content", text}, {"with_pieces", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json pieces = r.js()["tokens"];
  std::string joined;
  for (const json& p : pieces) {
    ASSERT_TRUE(p["id"].is_number_integer());
    joined += p["piece"].get<std::string>();
  }
  EXPECT_EQ(joined, " " + text);  // raw pieces: SentencePiece's space before the first word included
  json plain = json::array();
  for (const json& t : ids)
    if (t != 1) plain.push_back(t);  // without BOS
  r = post(s.port(), "/detokenize", {{"tokens", plain}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.js()["content"], text);
  // Control tokens read back as their text, as llama-server renders them.
  json framed = ids;
  framed.push_back(2);  // EOS
  r = post(s.port(), "/detokenize", {{"tokens", framed}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.js()["content"], "<s>" + text + "</s>");
  r = post(s.port(), "/apply-template", {{"messages", {{{"role", "user"}, {"content", "Hi there"}}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.js()["prompt"].get<std::string>().find("Hi there"), std::string::npos) << r.body;
  EXPECT_EQ(post(s.port(), "/detokenize", {{"tokens", {99999}}}).status, 400);
  const Reply unknown = post(s.port(), "/tokenize", {{"content", "x"}, {"add_bos", true}});
  EXPECT_EQ(unknown.status, 400);
  EXPECT_EQ(unknown.js()["error"]["param"], "add_bos");
  EXPECT_EQ(request(s.port(), "GET", "/tokenize").status, 405);
  const Reply emb = post(s.port(), "/v1/embeddings", {{"input", "x"}});
  EXPECT_EQ(emb.status, 404);
  EXPECT_EQ(emb.js()["error"]["code"], "embeddings_not_served");
  EXPECT_EQ(post(s.port(), "/v1/completions", {{"prompt", "x"}, {"temprature", 1}}).js()["error"]["param"], "temprature");
}

// --chat-template FILE: the prompt is the Jinja template's rendering (the
// text Jinja2 gives for Qwen3's template), chat_template_kwargs reach it,
// and a conversation the template refuses (its raise_exception) is a 400
// naming the template's message, on /apply-template and the chat endpoint.
TEST(Server, ChatTemplateFromAJinjaFile) {
  REQUIRE_SHARED();
  Server qwen({"-m", stories(), "--chat-template", kvs::test::shared("chat-templates/Qwen-Qwen3-0.6B.jinja")});
  const json msgs = {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}};
  Reply r = post(qwen.port(), "/apply-template", {{"messages", msgs}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.js()["prompt"], "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  r = post(qwen.port(), "/apply-template", {{"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.js()["prompt"],
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n");
  r = post(qwen.port(), "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.js()["usage"]["completion_tokens"], 4);
  EXPECT_EQ(post(qwen.port(), "/apply-template", {{"messages", msgs}, {"chat_template_kwargs", {{"tools", 1}}}}).status,
            400);

  Server nemo({"-m", stories(), "--chat-template",
               kvs::test::shared("chat-templates/mistralai-Mistral-Nemo-Instruct-2407.jinja")});
  const json twice = {{{"role", "user"}, {"content", "A"}}, {{"role", "user"}, {"content", "B"}}};
  for (const char* path : {"/apply-template", "/v1/chat/completions"}) {
    const Reply bad = post(nemo.port(), path, {{"messages", twice}, {"max_tokens", 2}});
    ASSERT_EQ(bad.status, 400) << path << ": " << bad.body;
    EXPECT_EQ(bad.js()["error"]["code"], "chat_template_error") << bad.body;
    EXPECT_NE(bad.body.find("roles must alternate"), std::string::npos) << bad.body;
  }
}
