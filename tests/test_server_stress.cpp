// Stress of the HTTP layer's threading, meant to run under ThreadSanitizer
// and ASan/UBSan (scripts/sanitize.sh) as well as in the normal build: one
// `kvserve serve` with API keys and four io threads, 64 concurrent streaming
// clients (two rounds each), a random subset hanging up mid-stream, one
// tenant revoke while streams of that tenant run, the other tenant's
// retention sweep dropping its blocks while it submits, and a /metrics
// poller.
// Every request that is not hung up must end in a well-formed stream or a
// proper error; afterwards every KV block is released and the server exits
// 0 on SIGTERM (a sanitizer report in it would make that non-zero).
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "http_client.h"
#include "kvs_process.h"
#include "sched/clock.h"
#include "server/tenants.h"
#include "test_util.h"

using nlohmann::json;
using namespace kvs::test;
using kvs::sched::steady_now;
using kvs::server::sha256_hex;

namespace {

constexpr int kClients = 64;
constexpr int kRounds = 2;

std::string words(int n, int salt) {
  static const char* w[] = {"the", "cat", "dog", "sun", "tree", "house", "river", "small", "big", "happy",
                            "park", "ball", "friend", "mom", "little", "girl", "boy", "bird", "fish", "cake"};
  std::string s;
  for (int i = 0; i < n; ++i) s += std::string(i ? " " : "") + w[(i * 7 + salt * 3 + i / 5) % 20];
  return s;
}

struct Plan {
  bool chat = false, hang_up = false, usage = false;
  int hang_up_after = 0;  // chunks
  int max_tokens = 0;
  std::string key, body;
};

// A mix of endpoints, lengths and tenants; prompts of one tenant share a
// long prefix so that prefix-cache hits and waits happen under the load.
Plan make_plan(int client, int round, std::mt19937& rng) {
  Plan p;
  const bool tenant_a = client % 2 == 0;
  p.key = tenant_a ? "key-a" : "key-b";
  p.chat = client % 3 == 0;
  p.hang_up = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
  p.hang_up_after = std::uniform_int_distribution<int>(1, 4)(rng);
  p.usage = client % 4 == 1;
  p.max_tokens = p.hang_up ? 300 : std::uniform_int_distribution<int>(16, 80)(rng);
  const std::string text = words(48, tenant_a ? 1 : 2) + " " + words(4 + client % 7, client * kRounds + round);
  json b = {{"max_tokens", p.max_tokens}, {"stream", true}, {"temperature", 0.8}, {"seed", client * 10 + round},
            {"ignore_eos", p.hang_up || client % 2 == 1}};
  if (p.chat) {
    b["messages"] = json::array({{{"role", "user"}, {"content", text}}});
  } else {
    b["prompt"] = text;
  }
  if (p.usage) b["stream_options"] = {{"include_usage", true}};
  p.body = b.dump();
  return p;
}

// Empty when `r` is a well-formed end of a request that was not hung up.
std::string check_reply(const Plan& p, const HttpReply& r) {
  if (r.status == 429 || r.status == 503) {
    if (!r.complete) return "incomplete error body";
    const json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded() || !j["error"].contains("message")) return "error without an OpenAI error object: " + r.body;
    if (r.status == 429 && !r.headers.count("retry-after")) return "429 without Retry-After";
    return "";
  }
  if (r.status != 200) return "status " + std::to_string(r.status) + ": " + r.body.substr(0, 200);
  if (!r.complete) return "stream cut off";
  if (r.headers.count("content-type") == 0 || r.headers.at("content-type") != "text/event-stream")
    return "not an event stream";
  const std::vector<std::string> ev = sse_payloads(r.body);
  if (ev.size() < 2 || ev.back() != "[DONE]") return "stream does not end with [DONE]";
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    const json j = json::parse(ev[i], nullptr, false);
    if (j.is_discarded()) return "event is not JSON: " + ev[i].substr(0, 200);
    if (j["object"] != (p.chat ? "chat.completion.chunk" : "text_completion")) return "wrong object: " + ev[i];
    if (j.contains("usage") && !j["usage"].is_null()) usage = j["usage"];
    for (const json& c : j["choices"])
      if (c.contains("finish_reason") && !c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  if (finish != "stop" && finish != "length") return "finish_reason '" + finish + "'";
  if (p.usage && (!usage.is_object() || usage["completion_tokens"].get<int>() < 1)) return "no usage chunk";
  return "";
}

// What the client, poller and revoker threads share.
struct Load {
  int port = 0;
  std::atomic<int> first_chunks{0}, hung_up_mid{0}, finished_clients{0}, checked{0};
  std::atomic<bool> stop_polling{false};
  json revoke_reply;
  std::mutex mu;
  std::vector<std::string> failures;

  void fail(const std::string& what) {
    std::lock_guard lk(mu);
    failures.push_back(what);
  }

  // One client: kRounds streamed requests, each checked unless it hung up
  // (one that was to hang up but ended first is checked too).
  void client(int c) {
    std::mt19937 rng(uint32_t(1000 + c));
    for (int round = 0; round < kRounds; ++round) {
      const Plan p = make_plan(c, round, rng);
      int chunks = 0;
      bool hung_up = false;
      const HttpReply r =
          http_request(port, "POST", p.chat ? "/v1/chat/completions" : "/v1/completions", p.body, bearer(p.key), 60,
                       0, [&](const std::string& chunk) {
                         if (chunks++ == 0) ++first_chunks;
                         hung_up = p.hang_up && chunks >= p.hang_up_after && chunk.find("[DONE]") == std::string::npos;
                         return !hung_up;
                       });
      if (hung_up) {
        ++hung_up_mid;
        continue;
      }
      const std::string err = check_reply(p, r);
      if (!err.empty()) fail("client " + std::to_string(c) + " round " + std::to_string(round) + ": " + err);
      ++checked;
    }
    ++finished_clients;
  }

  void poll_metrics() {
    int polls = 0;
    while (!stop_polling) {
      const HttpReply m = http_request(port, "GET", "/metrics");
      if (m.status != 200 || metric_value(m.body, "kvserve_kv_blocks_total") <= 0) fail("bad /metrics reply");
      ++polls;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    if (polls < 5) fail("the /metrics poller ran only " + std::to_string(polls) + " times");
  }

  // Tenant a's blocks are revoked while a's streams run and second-round
  // requests are being submitted (admission reads the prefix index that the
  // revoke drops from).
  void revoke() {
    const double t0 = steady_now();
    while (first_chunks < kClients + kClients / 8 && finished_clients < kClients && steady_now() - t0 < 60)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const HttpReply r = http_request(port, "POST", "/admin/tenants/a/revoke", "{}", bearer("key-admin"));
    if (r.status != 200) fail("revoke: status " + std::to_string(r.status) + " " + r.body);
    revoke_reply = json::parse(r.body, nullptr, false);
  }
};

// The /metrics text once nothing runs any more (the hung-up requests are
// cancelled and their blocks freed), or the last one read.
std::string metrics_when_idle(int port) {
  std::string m;
  const double t0 = steady_now();
  while (steady_now() - t0 < 20) {
    m = http_request(port, "GET", "/metrics").body;
    if (metric_value(m, "kvserve_kv_blocks_used") == 0 && metric_value(m, "kvserve_running_requests") == 0 &&
        metric_value(m, "kvserve_open_streams") == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return m;
}

std::string write_keys() {
  const std::string path = temp_dir() + "/stress-keys.json";
  std::ofstream f(path);
  f << json{{"keys",
             {{{"key_sha256", sha256_hex("key-a")}, {"tenant", "a"}},
              {{"key_sha256", sha256_hex("key-b")}, {"tenant", "b"}, {"class", "batch"}, {"retention_s", 1}},
              {{"key_sha256", sha256_hex("key-admin")}, {"tenant", "ops"}, {"admin", true}}}}}
           .dump();
  return path;
}

}  // namespace

TEST(ServerStress, ConcurrentStreamsHangUpsRevokeAndMetrics) {
  if (!shared_available()) GTEST_SKIP() << "../shared is not available";
  const double t_start = steady_now();
  ServeProcess s({"-m", shared("models/stories260K/stories260K.gguf"), "--api-keys", write_keys(), "--http-threads",
                  "4", "--threads", "2", "--max-seqs", "64", "--max-batch-tokens", "256", "--tenant-share", "1"});
  Load load;
  load.port = s.port();
  std::thread poller([&] { load.poll_metrics(); });
  std::thread revoker([&] { load.revoke(); });
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) clients.emplace_back([&, c] { load.client(c); });
  for (auto& t : clients) t.join();
  revoker.join();
  const std::string m = metrics_when_idle(load.port);
  load.stop_polling = true;
  poller.join();

  EXPECT_TRUE(load.failures.empty()) << load.failures.size() << " failures, first: " << load.failures.front();
  ASSERT_TRUE(load.revoke_reply.is_object());
  EXPECT_EQ(load.revoke_reply["permission_version"], 2);
  EXPECT_GE(load.revoke_reply["dropped_blocks"].get<int>(), 0);
  EXPECT_EQ(metric_value(m, "kvserve_kv_blocks_used"), 0) << m;
  EXPECT_EQ(metric_value(m, "kvserve_running_requests"), 0);
  EXPECT_EQ(metric_value(m, "kvserve_open_streams"), 0);
  EXPECT_EQ(metric_value(m, "kvserve_kv_blocks_free") + metric_value(m, "kvserve_kv_blocks_cached"),
            metric_value(m, "kvserve_kv_blocks_total"));
  const int hung_up = load.hung_up_mid;
  EXPECT_GT(hung_up, 0);
  EXPECT_EQ(load.checked + hung_up, kClients * kRounds);
  EXPECT_GE(metric_value(m, "kvserve_client_disconnects_total"), 1);
  EXPECT_LE(metric_value(m, "kvserve_client_disconnects_total"), hung_up);
  EXPECT_EQ(s.stop(), 0) << "a sanitizer report or a crash in the server";
  EXPECT_EQ(s.log().find("internal error"), std::string::npos);
  const double took = steady_now() - t_start;
  std::printf("stress: %d clients x %d rounds, %d checked, %d hung up mid-stream, %.1f s\n", kClients, kRounds,
              load.checked.load(), hung_up, took);
  EXPECT_LT(took, 120.0);
}

// SIGTERM closes the listener while connections keep arriving: the close,
// the accept handler and its retry timer must not run on two io threads at
// once (a data race under ThreadSanitizer before the listener had its own
// strand). Several short-lived servers, since each stop is one chance.
TEST(ServerStress, StopAcceptingWhileClientsConnect) {
  if (!shared_available()) GTEST_SKIP() << "../shared is not available";
  for (int cycle = 0; cycle < 12; ++cycle) {
    ServeProcess s({"-m", shared("models/stories260K/stories260K.gguf"), "--http-threads", "4", "--threads", "1"});
    const int port = s.port();
    std::atomic<bool> stop{false};
    std::atomic<int> ok{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < 4; ++c)
      clients.emplace_back([&] {
        // Until the listener is gone (connect refused) or the test is over.
        while (!stop) {
          const HttpReply r = http_request(port, "GET", "/health", "", {}, 10);
          if (r.status == 200) ++ok;
          if (r.status == 0 && ok > 0) break;
        }
      });
    const double t0 = steady_now();
    while (ok < 8 && steady_now() - t0 < 20) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(s.stop(), 0) << "cycle " << cycle;
    stop = true;
    for (auto& t : clients) t.join();
    EXPECT_GE(ok.load(), 8);
  }
}
