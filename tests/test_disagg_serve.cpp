// Disaggregated serving with real processes on 127.0.0.1 (stories260K):
// `kvserve serve --role prefill` and `--role decode` behind `kvserve router
// --prefill-worker --decode-worker`, next to a `--role both` server. Greedy
// and seeded outputs equal the `both` server's; the transfer counters and
// the request log show the hand-over; a handshake with another kv type is
// refused with the field named; a full decode pool answers 429 with
// Retry-After; the prefill worker killed mid-request and the decode worker
// killed mid-stream leave no blocks held on the survivor, which keeps
// serving; a client leaving mid-stream cancels the request on the decode
// worker; hand-overs nobody comes for are bounded on the decode worker.
// (Separate network namespaces are not used: loopback only.)
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <fstream>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "http_client.h"
#include "kvs_process.h"
#include "test_util.h"

using namespace kvs;
using nlohmann::json;
using test::KvsProcess;
using test::eventually;

namespace {

std::string stories() { return test::shared("models/stories260K/stories260K.gguf"); }

std::string secret_file() {
  const std::string p = test::temp_dir() + "/pd.secret";
  std::ofstream(p) << "0123456789abcdef0123456789abcdef";
  return p;
}

std::vector<std::string> serve_args(int http_port, std::vector<std::string> extra, const std::string& model = stories()) {
  std::vector<std::string> a = {"serve", "-m", model, "--port", std::to_string(http_port), "--threads", "1",
                                "--cache-secret-file", secret_file()};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Starts a worker on ports chosen beforehand. Another process may take
// such a port between free_port() and the worker's bind: on a first start
// that is retried on fresh ports (`pick`); a restart keeps its ports.
template <class Args, class Pick>
std::unique_ptr<KvsProcess> start_on_ports(bool first, Args args, Pick pick, const std::string& ready) {
  for (int attempt = 0;; ++attempt) {
    try {
      return std::make_unique<KvsProcess>(args(), ready);
    } catch (const std::runtime_error& e) {
      const std::string why = e.what();  // the HTTP bind's errno text, or UCX's status for its listener
      const bool taken = why.find("Address already in use") != std::string::npos || why.find("busy") != std::string::npos;
      if (!first || attempt == 3 || !taken) throw;
      pick();
    }
  }
}

// A decode worker on a fixed UCX port (so a restarted one is found again).
struct Decode {
  int http = test::free_port(), ucx = test::free_port();
  std::vector<std::string> extra;
  std::string model = stories();
  std::unique_ptr<KvsProcess> p;
  bool started = false;
  void start() {
    const auto args = [&] {
      std::vector<std::string> e = {"--role", "decode", "--kv-listen", "127.0.0.1:" + std::to_string(ucx)};
      e.insert(e.end(), extra.begin(), extra.end());
      return serve_args(http, e, model);
    };
    const auto pick = [&] { http = test::free_port(), ucx = test::free_port(); };
    p = start_on_ports(!started, args, pick, "kvserve: role decode");
    started = true;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(http); }
};

struct Prefill {
  int http = test::free_port();
  std::string model = stories();
  std::unique_ptr<KvsProcess> p;
  bool started = false;
  void start(const Decode& d, std::vector<std::string> extra = {}) { start_with({&d}, std::move(extra)); }
  void start_with(const std::vector<const Decode*>& ds, std::vector<std::string> extra = {}) {
    std::vector<std::string> e = {"--role", "prefill"};
    for (const Decode* d : ds) e.insert(e.end(), {"--decode-peer", "127.0.0.1:" + std::to_string(d->ucx)});
    e.insert(e.end(), extra.begin(), extra.end());
    p = start_on_ports(
        !started, [&] { return serve_args(http, e, model); }, [&] { http = test::free_port(); }, "kvserve: role prefill");
    started = true;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(http); }
};

std::unique_ptr<KvsProcess> start_router(const Prefill& pf, const std::vector<const Decode*>& ds,
                                         const std::string& health_interval = "0.2") {
  std::vector<std::string> a = {"router", "-m", pf.model, "--port", "0", "--cluster-secret", secret_file(),
                                "--health-interval", health_interval, "--startup-timeout", "20", "--prefill-worker", pf.url()};
  for (const Decode* d : ds) a.insert(a.end(), {"--decode-worker", d->url()});
  return std::make_unique<KvsProcess>(a, "kvserve router: listening on");
}
std::unique_ptr<KvsProcess> start_router(const Prefill& pf, const Decode& d) { return start_router(pf, {&d}); }

std::string story(int sentences) {
  std::string s;
  for (int i = 0; i < sentences; ++i) s += "Once upon a time there was a little girl who liked to play in the park. ";
  return s;
}

test::HttpReply complete(int port, const json& body, size_t stop_after = 0) {
  return test::http_request(port, "POST", "/v1/completions", body.dump(), {}, 60, stop_after);
}

json request(const std::string& prompt, int max_tokens, double temperature = 0, bool stream = false) {
  json b = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", temperature}, {"stream", stream}};
  if (temperature > 0) b["seed"] = 42;
  return b;
}

std::string text_of(const test::HttpReply& r) {
  const json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("choices")) return "<" + std::to_string(r.status) + " " + r.body + ">";
  return j["choices"][0]["text"].get<std::string>();
}

// The text of an SSE stream's chunks.
std::string stream_text(const std::string& body) {
  std::string t;
  size_t at = 0;
  while ((at = body.find("data: {", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const json j = json::parse(body.substr(at + 6, end - at - 6), nullptr, false);
    if (j.is_object() && j.contains("choices") && !j["choices"].empty()) t += j["choices"][0].value("text", "");
    at = end;
  }
  return t;
}

// POSTs `body` on a raw connection, calls `on_first` once the first SSE
// event arrived, and returns everything read until the server closes.
std::string stream_with(int port, const json& body, const std::function<void()>& on_first) {
  const int fd = test::connect_local(port, 30);
  if (fd < 0) return {};
  const std::string b = body.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Connection: close\r\nContent-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b;
  if (!test::send_all(fd, req)) {
    ::close(fd);
    return {};
  }
  std::string got;
  bool fired = false;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) {
    got.append(buf, size_t(n));
    if (!fired && got.find("data: {") != std::string::npos) {
      fired = true;
      on_first();
    }
  }
  ::close(fd);
  return got;
}

// No blocks used, and on a decode worker no transfer or unclaimed adoption
// (adoptions happen between engine steps, so the gauge is the live figure).
bool idle(int port) {
  const double holding = test::metric_value(port, "kvserve_kv_transfer_holding{role=\"decode\"}");
  return test::metric_value(port, "kvserve_kv_blocks_used") == 0 && holding <= 0;
}

#define REQUIRE_SHARED() \
  if (!test::shared_available()) GTEST_SKIP() << "needs ../shared"

}  // namespace

TEST(DisaggServe, OutputEqualsABothServerAndTheTransferIsCounted) {
  REQUIRE_SHARED();
  Decode d;
  d.start();
  Prefill pf;
  pf.start(d);
  KvsProcess both(serve_args(0, {}), "listening on");
  auto router = start_router(pf, d);
  const int rp = router->port(), bp = both.port();
  for (double temp : {0.0, 0.8}) {
    const json b = request(story(4), 24, temp);
    const test::HttpReply ref = complete(bp, b), got = complete(rp, b);
    ASSERT_EQ(ref.status, 200) << ref.body;
    ASSERT_EQ(got.status, 200) << got.body << router->log() << pf.p->log() << d.p->log();
    EXPECT_EQ(text_of(got), text_of(ref)) << "temperature " << temp;
  }
  // Streamed through the router from the decode worker.
  const json s = request(story(3), 16, 0, true);
  const test::HttpReply st = complete(rp, s);
  ASSERT_EQ(st.status, 200);
  EXPECT_EQ(stream_text(st.body), text_of(complete(bp, request(story(3), 16))));
  EXPECT_NE(st.body.find("data: [DONE]"), std::string::npos);
  // Logprobs cannot cross the hand-over whole: a 400 naming the field, not
  // a list without the first token (audit 9 H4).
  json lp = request(story(4), 4, 0);
  lp["logprobs"] = 1;
  const test::HttpReply refused = complete(rp, lp);
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("\"param\":\"logprobs\""), std::string::npos) << refused.body;
  // Two prompts: the 400 names the prompt, not n (audit 9 L5).
  json two = request(story(1), 4, 0);
  two["prompt"] = {story(1), story(2)};
  const test::HttpReply prompts = complete(rp, two);
  EXPECT_EQ(prompts.status, 400) << prompts.body;
  EXPECT_NE(prompts.body.find("\"param\":\"prompt\""), std::string::npos) << prompts.body;
  EXPECT_NE(prompts.body.find("one prompt (it has 2)"), std::string::npos) << prompts.body;
  // A stale or forged hand-over handle is the request's fault: a 400 (audit 9 M7).
  const test::HttpReply stale = test::http_request(d.http, "POST", "/v1/completions?kv_handover=1.2.3.4",
                                                   request(story(1), 4, 0).dump(), {{"Content-Type", "application/json"}});
  EXPECT_EQ(stale.status, 400) << stale.body;
  EXPECT_NE(stale.body.find("gone"), std::string::npos) << stale.body;

  const double sent = test::metric_value(pf.http, "kvserve_kv_transfer_blocks_total{role=\"prefill\"}");
  EXPECT_GT(sent, 0);
  EXPECT_EQ(sent, test::metric_value(d.http, "kvserve_kv_transfer_blocks_total{role=\"decode\"}"));
  EXPECT_GT(test::metric_value(d.http, "kvserve_kv_transfer_bytes_total{role=\"decode\"}"), 0);
  // The prompts share their first sentences: some blocks did not travel again.
  EXPECT_GT(test::metric_value(pf.http, "kvserve_kv_transfer_skipped_blocks_total{role=\"prefill\"}"), 0);
  EXPECT_TRUE(eventually([&] { return idle(pf.http) && idle(d.http); }, 10));
  EXPECT_NE(pf.p->log().find("handover_ms="), std::string::npos);
  EXPECT_NE(d.p->log().find("handover="), std::string::npos);
  // The router's access log: each leg, its worker and status; no prompt, no
  // hand-over handle.
  const std::string rl = router->log();
  EXPECT_NE(rl.find("request POST /v1/completions leg=prefill worker=" + pf.url() + " status=200"), std::string::npos) << rl;
  EXPECT_NE(rl.find("request POST /v1/completions leg=decode worker=" + d.url() + " status=200"), std::string::npos) << rl;
  EXPECT_EQ(rl.find("Once upon"), std::string::npos) << rl;
  EXPECT_EQ(rl.find("kv_handover"), std::string::npos) << rl;
}

// A long prompt's offer (token ids and chain keys) is larger than UCX's
// default transport segment; it once aborted the prefill worker.
TEST(DisaggServe, LongPromptTravelsAndMatchesABothServer) {
  REQUIRE_SHARED();
  const std::string tiny = test::shared("models/tiny-random/tiny-llama-f16.gguf");
  Decode d;
  d.model = tiny;
  d.extra = {"--ctx", "4096"};
  d.start();
  Prefill pf;
  pf.model = tiny;
  pf.start(d, {"--ctx", "4096"});
  KvsProcess both(serve_args(0, {"--ctx", "4096"}, tiny), "listening on");
  auto router = start_router(pf, d);
  const json b = request(story(120), 4);
  const test::HttpReply ref = complete(both.port(), b), got = complete(router->port(), b);
  ASSERT_EQ(ref.status, 200) << ref.body;
  ASSERT_GE(json::parse(ref.body)["usage"]["prompt_tokens"].get<int>(), 1500);
  ASSERT_EQ(got.status, 200) << got.body << pf.p->log();
  EXPECT_EQ(text_of(got), text_of(ref));
  EXPECT_TRUE(pf.p->alive());
}

TEST(DisaggServe, HandshakeWithAnotherKvTypeIsRefusedWithTheFieldNamed) {
  REQUIRE_SHARED();
  Decode d;
  d.extra = {"--kv-type", "f16"};
  d.start();
  Prefill pf;
  pf.start(d);
  const test::HttpReply r = complete(pf.http, request(story(2), 4));
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("kv type"), std::string::npos) << r.body;
  EXPECT_NE(d.p->log().find("kv type"), std::string::npos) << d.p->log();
  EXPECT_TRUE(eventually([&] { return idle(pf.http) && idle(d.http); }, 10));
}

TEST(DisaggServe, FullDecodePoolIs429WithRetryAfter) {
  REQUIRE_SHARED();
  Decode d;
  // One 256-token context of stories260K's f32 K/V: sixteen blocks.
  d.extra = {"--ctx", "256", "--kv-memory", "320KiB", "--max-request-share", "1", "--kv-headroom", "0",
             "--kv-claim-timeout", "1"};
  d.start();
  Prefill pf;
  pf.start(d);
  auto router = start_router(pf, d);
  // Handed over straight from the prefill worker and never claimed: ten
  // blocks held on the decode worker until the claim timeout.
  const test::HttpReply held = complete(pf.http, request(story(6), 4));
  ASSERT_EQ(held.status, 200) << held.body;
  EXPECT_NE(held.body.find("kv.handover"), std::string::npos);
  EXPECT_EQ(test::metric_value(d.http, "kvserve_kv_transfer_holding{role=\"decode\"}"), 1);
  std::string other;
  for (int i = 0; i < 5; ++i) other += "The dog ran fast in the green field and barked at the birds. ";
  const test::HttpReply r = complete(router->port(), request(other, 4));
  EXPECT_EQ(r.status, 429) << r.body;
  ASSERT_TRUE(r.headers.count("retry-after"));
  EXPECT_FALSE(r.headers.at("retry-after").empty());
  EXPECT_NE(r.body.find("decode worker has no free KV blocks"), std::string::npos) << r.body;
  EXPECT_TRUE(eventually([&] { return idle(pf.http) && idle(d.http); }, 10));
  // The unclaimed blocks are back: the same request goes through.
  EXPECT_EQ(complete(router->port(), request(other, 4)).status, 200);
  EXPECT_TRUE(eventually([&] { return idle(pf.http) && idle(d.http); }, 10));
}

// Anyone who can post to a prefill worker makes hand-overs that no request
// comes for (audit 9 M6): the decode worker keeps at most
// --kv-unclaimed-max-blocks of their blocks, the newest aside, freeing the
// oldest, where each used to hold its blocks for the claim timeout. The
// expected figures follow that rule over the block counts each hand-over
// reports; the router's own requests still go through.
TEST(DisaggServe, UnclaimedHandOversAreBoundedOnTheDecodeWorker) {
  REQUIRE_SHARED();
  try {
    KvsProcess bad(serve_args(0, {"--kv-unclaimed-max-blocks", "4"}), "listening on", 30);
    ADD_FAILURE() << "--kv-unclaimed-max-blocks accepted without --role decode";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("it needs --role decode"), std::string::npos) << e.what();
  }
  const int64_t bound = 12;
  Decode d;
  d.extra = {"--kv-unclaimed-max-blocks", std::to_string(bound)};
  d.start();
  Prefill pf;
  pf.start(d);
  auto router = start_router(pf, d);
  std::vector<std::pair<json, int64_t>> held;  // hand-over, blocks, oldest first
  int64_t unclaimed = 0, released = 0;
  const std::vector<std::string> who = {"a cat", "a dog", "a fox", "an owl", "a bee", "a frog"};
  for (const std::string& w : who) {
    const test::HttpReply r = complete(pf.http, request("Once upon a time there was " + w + ". " + story(2), 4));
    ASSERT_EQ(r.status, 200) << r.body;
    const json h = json::parse(r.body);
    ASSERT_EQ(h["object"], "kv.handover") << r.body;
    const int64_t blocks = h["blocks"].get<int64_t>() + h["skipped_blocks"].get<int64_t>();
    held.emplace_back(h, blocks);
    unclaimed += blocks;
    for (size_t i = 0; unclaimed > bound && i + 1 < held.size();) {  // the oldest go, the newest stays
      unclaimed -= held[i].second;
      held.erase(held.begin() + long(i));
      ++released;
    }
    EXPECT_EQ(test::metric_value(d.http, "kvserve_kv_transfer_unclaimed_blocks{role=\"decode\"}"), unclaimed) << w;
    EXPECT_EQ(test::metric_value(d.http, "kvserve_kv_transfer_unclaimed_released_total{role=\"decode\"}"), released);
    EXPECT_EQ(test::metric_value(d.http, "kvserve_kv_transfer_holding{role=\"decode\"}"), double(held.size()));
  }
  EXPECT_GE(released, 2);
  EXPECT_NE(d.p->log().find("freed before any request came for it"), std::string::npos) << d.p->log();
  // Through the router the request comes for its hand-over and is served.
  // Its hand-over was the newest: the oldest direct ones made room for it,
  // and the survivors are the newest of them.
  const test::HttpReply r = complete(router->port(), request(story(3), 4));
  EXPECT_EQ(r.status, 200) << r.body;
  const auto k = size_t(
      test::metric_value(d.http, "kvserve_kv_transfer_unclaimed_released_total{role=\"decode\"}") - double(released));
  ASSERT_LE(k, held.size());
  int64_t survivors = 0;
  for (size_t i = k; i < held.size(); ++i) survivors += held[i].second;
  EXPECT_LE(survivors, bound);
  EXPECT_EQ(test::metric_value(d.http, "kvserve_kv_transfer_unclaimed_blocks{role=\"decode\"}"), survivors);
  EXPECT_EQ(test::metric_value(d.http, "kvserve_kv_transfer_holding{role=\"decode\"}"), double(held.size() - k));
}

TEST(DisaggServe, PrefillKilledMidRequestLeavesTheDecodeWorkerIdleAndServing) {
  REQUIRE_SHARED();
  Decode d;
  d.extra = {"--kv-transfer-timeout", "2", "--kv-claim-timeout", "2"};
  d.start();
  Prefill pf;
  pf.start(d);
  auto router = start_router(pf, d);
  const int rp = router->port();
  // A prompt near the context: the kill lands while it is prefilled or shipped.
  auto pending = std::async(std::launch::async, [&] { return complete(rp, request(story(19), 8)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  pf.p->kill9();
  const test::HttpReply r = pending.get();
  if (r.status == 200) GTEST_LOG_(INFO) << "the request finished before the kill landed; checking the survivor only";
  else EXPECT_EQ(r.status, 502) << r.body;
  // Whatever the decode side reserved or adopted is freed (disconnect,
  // transfer or claim timeout).
  EXPECT_TRUE(eventually([&] { return idle(d.http); }, 10));
  Prefill again;
  again.http = pf.http;
  again.start(d);
  EXPECT_TRUE(eventually([&] { return complete(rp, request("Once upon a time", 4)).status == 200; }, 15));
}

TEST(DisaggServe, DecodeKilledMidStreamEndsTheStreamWithAnErrorAndThePrefillWorkerRecovers) {
  REQUIRE_SHARED();
  Decode d;
  d.start();
  Prefill pf;
  pf.start(d);
  auto router = start_router(pf, d);
  const int rp = router->port();
  json b = request(story(2), 400, 0, true);
  b["ignore_eos"] = true;
  const std::string body = stream_with(rp, b, [&] { d.p->kill9(); });
  ASSERT_FALSE(body.empty());
  if (body.find("worker_failed") == std::string::npos)
    GTEST_LOG_(INFO) << "the stream ended before the kill landed; checking the survivor only";
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << body;
  EXPECT_TRUE(eventually([&] { return idle(pf.http); }, 10));
  // With the decode worker gone the prefill worker answers with a clear
  // error and holds nothing; once it is back, requests flow again.
  const test::HttpReply lost = complete(pf.http, request("Once upon a time", 4));
  EXPECT_EQ(lost.status, 500);
  EXPECT_NE(lost.body.find("decode worker"), std::string::npos) << lost.body;
  EXPECT_TRUE(eventually([&] { return idle(pf.http); }, 10));
  d.start();
  EXPECT_TRUE(eventually([&] { return complete(rp, request("Once upon a time", 4)).status == 200; }, 20));
}

TEST(DisaggServe, ClientLeavingMidStreamCancelsOnTheDecodeWorker) {
  REQUIRE_SHARED();
  Decode d;
  d.start();
  Prefill pf;
  pf.start(d);
  auto router = start_router(pf, d);
  json b = request("Once upon a time", 450, 0, true);
  b["ignore_eos"] = true;
  const test::HttpReply r = complete(router->port(), b, 300);  // hangs up after a few chunks
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.find("data: [DONE]"), std::string::npos);
  // The router hangs up on the decode worker, which cancels the request.
  EXPECT_TRUE(eventually([&] { return test::metric_value(d.http, "kvserve_client_disconnects_total") >= 1; }, 10));
  EXPECT_TRUE(eventually([&] { return idle(pf.http) && idle(d.http); }, 10));
  EXPECT_EQ(complete(router->port(), request("Once upon a time", 4)).status, 200);
}

// One prefill worker, two decode workers: the router picks the decode worker
// per request (both get some), output equals a both server's, a decode
// address the prefill worker was not given is refused, and a decode worker
// killed between requests costs no request (its hand-over fails, the router
// tries the other one).
TEST(DisaggServe, RouterChoosesTheDecodeWorkerPerRequestAndGoesAroundADeadOne) {
  REQUIRE_SHARED();
  Decode d1, d2;
  d1.start();
  d2.start();
  Prefill pf;
  pf.start_with({&d1, &d2}, {"--kv-transfer-timeout", "3"});
  KvsProcess both(serve_args(0, {}), "listening on");
  // Health checks too rare to notice the kill below: the retry must.
  auto router = start_router(pf, {&d1, &d2}, "60");
  const int rp = router->port(), bp = both.port();

  const json h1 = json::parse(test::http_request(d1.http, "GET", "/health", "").body, nullptr, false);
  EXPECT_EQ(h1.value("kv_listen", ""), "127.0.0.1:" + std::to_string(d1.ucx));
  const json hp = json::parse(test::http_request(pf.http, "GET", "/health", "").body, nullptr, false);
  ASSERT_TRUE(hp.contains("decode_peers")) << hp.dump();
  EXPECT_EQ(hp["decode_peers"].size(), 2u);

  auto prompt = [](int i) { return story(1 + i % 3) + "Her name was " + std::string(1, char('A' + i)) + "."; };
  for (int i = 0; i < 6; ++i) {
    const json b = request(prompt(i), 12);
    const test::HttpReply got = complete(rp, b);
    ASSERT_EQ(got.status, 200) << got.body << router->log();
    EXPECT_EQ(text_of(got), text_of(complete(bp, b))) << "request " << i;
  }
  const std::string decoded = "kvserve_kv_transfers_total{role=\"decode\"}";
  EXPECT_GE(test::metric_value(d1.http, decoded), 1) << "the router never chose decode worker 1";
  EXPECT_GE(test::metric_value(d2.http, decoded), 1) << "the router never chose decode worker 2";

  const test::HttpReply bad = test::http_request(pf.http, "POST", "/v1/completions?kv_decode_peer=127.0.0.1:1",
                                                 request("Once upon a time", 4).dump());
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("kv_decode_peer"), std::string::npos) << bad.body;

  // Killed between requests; the router still thinks it is up.
  d1.p->kill9();
  for (int i = 6; i < 10; ++i) {
    const json b = request(prompt(i), 8);
    const test::HttpReply got = complete(rp, b);
    ASSERT_EQ(got.status, 200) << "request " << i << ": " << got.body << router->log();
    EXPECT_EQ(text_of(got), text_of(complete(bp, b))) << "request " << i;
  }
  EXPECT_GE(test::metric_value(rp, "kvserve_router_retries_total"), 1);
  EXPECT_TRUE(eventually([&] { return idle(pf.http) && idle(d2.http); }, 10));
}

// The prefill leg answers only after the whole prompt: a client that hangs
// up meanwhile must stop the prefill too, not leave it running to a
// hand-over nobody claims.
TEST(DisaggServe, ClientLeavingDuringThePrefillCancelsItOnThePrefillWorker) {
  REQUIRE_SHARED();
  const std::string tiny = test::shared("models/tiny-random/tiny-llama-f16.gguf");
  Decode d;
  d.model = tiny;
  d.extra = {"--ctx", "4096"};
  d.start();
  Prefill pf;
  pf.model = tiny;
  pf.start(d, {"--ctx", "4096"});
  auto router = start_router(pf, d);
  const int fd = test::connect_local(router->port(), 30);
  ASSERT_GE(fd, 0);
  const std::string b = request(story(200), 4).dump();  // about 3,400 tokens: seconds of prefill
  ASSERT_TRUE(test::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                 "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::close(fd);
  EXPECT_TRUE(eventually([&] { return test::metric_value(pf.http, "kvserve_client_disconnects_total") >= 1; }, 10))
      << pf.p->log();
  EXPECT_EQ(test::metric_value(pf.http, "kvserve_kv_transfers_total{role=\"prefill\"}"), 0)
      << "the prefill ran to its hand-over";
  EXPECT_TRUE(eventually([&] { return idle(pf.http) && idle(d.http); }, 10));
  EXPECT_EQ(complete(router->port(), request("Once upon a time", 4)).status, 200);
}
