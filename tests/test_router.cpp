// `kvserve router` in front of two real `kvserve serve` workers (stories260K)
// on 127.0.0.1 free ports: cache-aware placement (also over CURVE, and wrong
// CURVE keys that get no events), a worker of another model or of another
// vocabulary or chat template than the router's refused (at start, or later
// with the reason logged), start with the first usable worker, failover after
// kill -9 and recovery, all workers down, /health
// in P/D mode without a pair, P/D pairing by address, large headers, the
// workers' other routes (token tools, Responses API), all workers saturated
// (429 with Retry-After), a stalled stream ended with an error event and
// [DONE], a client leaving mid-stream, and malformed, replayed or missing
// KV-event streams.
#include <gtest/gtest.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "curve_key_files.h"
#include "events/kv_event_codec.h"
#include "http_client.h"
#include "kvs_process.h"
#include "sched/clock.h"
#include "router_fixture.h"
#include "test_util.h"

using namespace kvs;
using nlohmann::json;
using test::KvsProcess;
using test::eventually;
using namespace kvs::router_test;

// Asks each of `prefixes` prefixes `rounds` times with another question,
// round by round, and checks that every repeat found its prefix cached
// (all but its last, partial block): the prefix went to one worker.
void expect_repeats_cached(int port, int prefixes, int rounds) {
  int prompt_tokens = 0, cached = 0;
  for (int q = 0; q < rounds; ++q) {
    for (int k = 0; k < prefixes; ++k) {
      const auto rep = complete(port, prefix(k) + "Question " + std::to_string(q) + ":", 4);
      ASSERT_EQ(rep.status, 200) << rep.body;
      const json j = json::parse(rep.body);
      prompt_tokens += j["usage"]["prompt_tokens"].get<int>();
      if (q > 0) cached += j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the events arrive
  }
  const double per_prefix_blocks = std::floor(double(prompt_tokens) / (prefixes * rounds) / 16) - 1;
  EXPECT_GE(cached, int(prefixes * (rounds - 1) * per_prefix_blocks * 16)) << "cached " << cached;
}

TEST(Router, CacheAwareKeepsEachPrefixOnOneWorker) {
  REQUIRE_SHARED();
  TwoWorkers c;
  const int port = c.port;
  Worker &w0 = c.w0, &w1 = c.w1;
  expect_repeats_cached(port, 4, 3);
  // New prefixes were spread over both workers.
  EXPECT_GT(test::metric_value(port, routed_to(w0.url())), 0);
  EXPECT_GT(test::metric_value(port, routed_to(w1.url())), 0);
  EXPECT_EQ(test::metric_value(port, "kvserve_router_predicted_cached_tokens_total"),
            test::metric_value(port, "kvserve_router_actual_cached_tokens_total"));
  EXPECT_GT(test::metric_value(port, "kvserve_router_index_blocks"), 0);
}

// Workers publish their events with CURVE and let in only the router's
// key: that router routes cache-aware from them. A router whose key the
// workers do not list, and one holding another server key, get no events:
// their failed handshakes are counted and logged, and they still route.
TEST(Router, CurveEventsRouteCacheAwareAndWrongKeysGetNone) {
  REQUIRE_SHARED();
  const test::CurvePair wk = test::curve_pair(), rk = test::curve_pair(), other = test::curve_pair();
  const std::string worker_key = test::curve_key_file("worker.key", wk, "", {rk.pub});
  TwoWorkers c({"--kv-events-curve", worker_key},
               {"--kv-events-curve", test::curve_key_file("router.key", rk, wk.pub)});
  const int port = c.port;
  Worker &w0 = c.w0, &w1 = c.w1;
  const std::vector<std::string> specs = {w0.spec(), w1.spec()};
  // Both streams joined (the router subscribes as it starts, asynchronously).
  for (const Worker* w : {&w0, &w1})
    ASSERT_TRUE(eventually(
        [&] { return test::metric_value(port, "kvserve_router_events_connected{worker=\"" + w->url() + "\"}") == 1; },
        10));
  // A prefix cached on w1 behind the router's back is known from w1's
  // events alone, and the router sends the next request with it there.
  const json direct = {{"prompt", prefix(0) + "Question 0:"}, {"max_tokens", 4}, {"temperature", 0}};
  ASSERT_EQ(test::http_request(w1.http, "POST", "/v1/completions", direct.dump()).status, 200);
  // Every block of it indexed: a first event batch alone was seen to leave
  // the router without the prefix's later blocks (a flake under ctest -j2).
  // And w1's load as the router last polled it back at 0: a poll taken
  // while the direct request ran would weigh against w1 (seen under ctest -j2).
  ASSERT_TRUE(eventually(
      [&] {
        const double a = test::metric_value(port, "kvserve_router_index_blocks");
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        return a > 0 && test::metric_value(port, "kvserve_router_index_blocks") == a &&
               test::metric_value(port, "kvserve_router_worker_load{worker=\"" + w1.url() + "\"}") == 0;
      },
      10));
  const auto rep = complete(port, prefix(0) + "Question 1:", 4);
  ASSERT_EQ(rep.status, 200) << rep.body;
  EXPECT_EQ(test::metric_value(port, routed_to(w1.url())), 1);
  EXPECT_GT(json::parse(rep.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  expect_repeats_cached(port, 4, 2);
  for (const Worker* w : {&w0, &w1}) {
    const std::string label = "{worker=\"" + w->url() + "\"}";
    // A worker that served requests stored blocks, and their events came.
    if (test::metric_value(port, routed_to(w->url())) > 0) {
      EXPECT_GT(test::metric_value(port, "kvserve_router_events_batches_total" + label), 0);
    }
    EXPECT_EQ(test::metric_value(port, "kvserve_router_events_handshake_failures_total" + label), 0);
  }
  EXPECT_GT(test::metric_value(port, "kvserve_router_index_blocks"), 0);

  auto refused = start_router(specs, {"--kv-events-curve", test::curve_key_file("other.key", other, wk.pub)});
  auto mismatched = start_router(specs, {"--kv-events-curve", test::curve_key_file("mismatch.key", rk, other.pub)});
  for (const KvsProcess* bad : {refused.get(), mismatched.get()}) {
    const int bport = bad->port();
    const std::string label = "{worker=\"" + w0.url() + "\"}";
    EXPECT_TRUE(eventually(
        [&] { return test::metric_value(bport, "kvserve_router_events_handshake_failures_total" + label) >= 1; }, 10));
    EXPECT_EQ(complete(bport, prefix(0) + "Question 9:", 4).status, 200);
    EXPECT_EQ(test::metric_value(bport, "kvserve_router_events_batches_total" + label), 0);
    EXPECT_EQ(test::metric_value(bport, "kvserve_router_events_connected" + label), 0);
    EXPECT_NE(bad->log().find("KV-event handshake failed"), std::string::npos) << bad->log();
  }
  EXPECT_NE(refused->log().find("refused this router's CURVE key"), std::string::npos) << refused->log();
  EXPECT_NE(mismatched->log().find("CURVE keys do not match"), std::string::npos) << mismatched->log();
  EXPECT_GE(test::metric_value(w0.http, "kvserve_kv_events_curve_refused_total"), 1);
}

TEST(Router, RefusesAWorkerOfAnotherModel) {
  REQUIRE_SHARED();
  Worker w0, w1;
  w1.extra = {"--block-size", "32"};  // the same weights, keyed another way
  w0.start();
  w1.start();
  try {
    start_router({w0.spec(), w1.spec()});
    FAIL() << "the router started";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("serves another model"), std::string::npos) << msg;
    EXPECT_NE(msg.find(w1.url()), std::string::npos) << msg;
  }
}

// A "worker" whose /health reports another prefix-key protocol (what an
// older or patched kvserve would report): its keys would never match the
// router's, so the router refuses it by name instead of routing every
// request as a miss.
TEST(Router, RefusesAWorkerWhosePrefixKeysDiffer) {
  REQUIRE_SHARED();
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(::listen(lfd, 16), 0);
  const int port = ntohs(a.sin_port);
  std::atomic<bool> stop{false};
  std::thread stub([&] {
    const std::string body = json{{"status", "ok"}, {"model", "stories260K"}, {"model_identity", "abc123"},
                                  {"block_size", 16}, {"prefix_key_protocol", "kv-prefix-v0:0000"}}
                                 .dump();
    const std::string reply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    while (!stop) {
      timeval tv{0, 100000};
      fd_set fds;
      FD_ZERO(&fds);
      FD_SET(lfd, &fds);
      if (::select(lfd + 1, &fds, nullptr, nullptr, &tv) <= 0) continue;
      const int c = ::accept(lfd, nullptr, nullptr);
      if (c < 0) continue;
      char buf[4096];
      (void)::recv(c, buf, sizeof buf, 0);
      (void)::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      ::close(c);
    }
  });
  std::string msg;
  try {
    KvsProcess router({"router", "-m", stories(), "--port", "0", "--cluster-secret", secret_file(), "--startup-timeout",
                       "2", "--worker", "http://127.0.0.1:" + std::to_string(port)},
                      "kvserve router: listening on", 30);
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  stop = true;
  stub.join();
  ::close(lfd);
  EXPECT_NE(msg.find("prefix keys are not this router's"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kv-prefix-v0:0000"), std::string::npos) << msg;
}

// The router tokenizes prompts with its own -m: one whose vocabulary is
// not the workers' is refused at start, naming both (it used to start and
// hash every prompt with the wrong tokenizer, so every prediction missed).
TEST(Router, RefusesWorkersWhoseVocabularyIsNotItsModels) {
  REQUIRE_SHARED();
  Worker w0;
  w0.start();
  std::string msg;
  try {
    KvsProcess router({"router", "-m", tiny_llama(), "--port", "0", "--cluster-secret", secret_file(),
                       "--startup-timeout", "5", "--worker", w0.spec()},
                      "kvserve router: listening on", 30);
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("vocabulary is not the router's -m's"), std::string::npos) << msg;
  EXPECT_NE(msg.find(w0.url()), std::string::npos) << msg;
}

// The router renders chat prompts with its own template to hash them: a
// worker that applies another (its --chat-template) is left out with the
// reason logged, and a router whose template no worker shares refuses to
// start, naming both. It routed every chat request on hashes of text the
// workers never saw.
TEST(Router, LeavesOutAWorkerWhoseChatTemplateIsNotItsOwn) {
  REQUIRE_SHARED();
  Worker w0, w1;
  w1.extra = {"--chat-template", "chatml"};  // stories260K has none: the others render the plain fallback
  w0.start();
  w1.start();
  for (const Worker* w : {&w0, &w1}) {
    const json h = json::parse(test::http_request(w->http, "GET", "/health").body);
    EXPECT_EQ(h.value("chat_template_fingerprint", "").rfind("chat-v1:", 0), 0u) << h.dump();
  }
  auto r = start_router({w0.spec(), w1.spec()});
  const std::string said = "worker " + w1.url() + " is down: its chat template is not the router's";
  EXPECT_TRUE(eventually([&] { return r->log().find(said) != std::string::npos; }, 10)) << r->log();
  EXPECT_EQ(test::metric_value(r->port(), "kvserve_router_worker_up{worker=\"" + w1.url() + "\"}"), 0);
  EXPECT_EQ(test::metric_value(r->port(), "kvserve_router_worker_up{worker=\"" + w0.url() + "\"}"), 1);
  std::string msg;
  try {
    start_router({w0.spec()}, {"--chat-template", "llama3"});
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("chat template is not the router's"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama3 (hand-written)"), std::string::npos) << msg;
  EXPECT_NE(msg.find(w0.url()), std::string::npos) << msg;
  // The same template the workers use: they are let in.
  auto same = start_router({w1.spec()}, {"--chat-template", "chatml"});
  EXPECT_EQ(test::metric_value(same->port(), "kvserve_router_worker_up{worker=\"" + w1.url() + "\"}"), 1);
}

// A worker that comes up after the start serving another model is never
// routed, and the log says why (it used to be left out without a word).
TEST(Router, ALateWorkerOfAnotherModelIsLeftOutWithItsReasonLogged) {
  REQUIRE_SHARED();
  Worker w0, w1;
  w0.start();
  w1.model = tiny_llama();
  w1.extra = {"--ctx", "512"};
  KvsProcess router({"router", "-m", stories(), "--port", "0", "--cluster-secret", secret_file(), "--health-interval",
                     "0.2", "--startup-timeout", "1", "--worker", w0.spec(), "--worker", w1.spec()},
                    "kvserve router: listening on", 30);
  w1.start();
  EXPECT_TRUE(eventually(
      [&] {
        const std::string log = router.log();
        return log.find("worker " + w1.url() + " is down: its vocabulary is not the router's") != std::string::npos;
      },
      10))
      << router.log();
  EXPECT_EQ(test::metric_value(router.port(), "kvserve_router_worker_up{worker=\"" + w1.url() + "\"}"), 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(complete(router.port(), "Once upon a time " + std::to_string(i), 2).status, 200);
}

TEST(Router, FailoverAfterKillAndRecovery) {
  REQUIRE_SHARED();
  TwoWorkers c({}, {"--policy", "round-robin"});
  const int port = c.port;
  Worker& w0 = c.w0;
  ASSERT_EQ(complete(port, "Once upon a time", 4).status, 200);
  w0.p->kill9();
  for (int i = 0; i < 6; ++i) {
    const auto rep = complete(port, "Once upon a time " + std::to_string(i), 4);
    EXPECT_EQ(rep.status, 200) << rep.body;  // retried on the other worker
  }
  EXPECT_EQ(test::metric_value(port, "kvserve_router_worker_up{worker=\"" + w0.url() + "\"}"), 0);
  EXPECT_EQ(test::http_request(port, "GET", "/health").status, 200);
  // Restarted where it was, the worker is routable again after a health check.
  const double before = std::max(0.0, test::metric_value(port, routed_to(w0.url())));
  w0.start();
  const double t0 = sched::steady_now();
  ASSERT_TRUE(eventually(
      [&] { return test::metric_value(port, "kvserve_router_worker_up{worker=\"" + w0.url() + "\"}") == 1; }, 10));
  std::printf("worker back in the rotation %.2f s after its restart printed ready\n", sched::steady_now() - t0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(complete(port, "The sun " + std::to_string(i), 4).status, 200);
  EXPECT_GT(test::metric_value(port, routed_to(w0.url())), before);
  // The access log has the failed attempt (status 0, why) and the retry.
  const std::string rl = c.router->log();
  EXPECT_NE(rl.find("request POST /v1/completions worker=" + w0.url() + " status=0"), std::string::npos) << rl;
  EXPECT_NE(rl.find("failed=\""), std::string::npos) << rl;
  EXPECT_NE(rl.find("request POST /v1/completions worker=" + c.w1.url() + " status=200"), std::string::npos) << rl;
}

// A worker restarted faster than the router's health checks notice (audit 9
// H1): its sequence 0 (all blocks cleared) goes out before the router's
// subscriber is back, and its later batches carry sequences the old process
// used or passed. The stream's reconnection must read as a restart (the old
// blocks dropped, the new process's replayed), not as duplicates or a gap.
TEST(Router, AWorkerRestartedUnseenIsARestart) {
  REQUIRE_SHARED();
  TwoWorkers c({}, {"--health-interval", "60"});
  Worker& w0 = c.w0;
  const std::string label = "{worker=\"" + w0.url() + "\"}";
  for (int i = 0; i < 8; ++i) ASSERT_EQ(complete(w0.http, prefix(i % 4) + std::to_string(i), 2).status, 200);
  ASSERT_TRUE(eventually([&] { return test::metric_value(c.port, "kvserve_router_events_batches_total" + label) >= 4; }, 10));
  w0.p->kill9();
  w0.start();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(complete(w0.http, "A new story " + std::to_string(i), 2).status, 200);
  const bool seen =
      eventually([&] { return test::metric_value(c.port, "kvserve_router_events_restarts_total" + label) == 1; }, 10);
  EXPECT_TRUE(seen) << c.router->log() << test::http_request(c.port, "GET", "/metrics").body;
  EXPECT_EQ(test::metric_value(c.port, "kvserve_router_events_duplicates_total" + label), 0);
}

TEST(Router, AllWorkersDownIs503WithReasons) {
  REQUIRE_SHARED();
  TwoWorkers c;
  const int port = c.port;
  Worker &w0 = c.w0, &w1 = c.w1;
  w0.p->kill9();
  w1.p->kill9();
  const auto rep = complete(port, "Once upon a time", 4);
  EXPECT_EQ(rep.status, 503) << rep.body;
  const json j = json::parse(rep.body);
  EXPECT_EQ(j["error"]["code"], "no_worker");
  const std::string msg = j["error"]["message"];
  EXPECT_NE(msg.find(w0.url()), std::string::npos) << msg;
  EXPECT_NE(msg.find(w1.url()), std::string::npos) << msg;
  // When to come back: the next health check may find a worker (audit 9 L4).
  EXPECT_EQ(rep.headers.count("retry-after") ? rep.headers.at("retry-after") : "", "1");
  EXPECT_TRUE(eventually([&] { return test::http_request(port, "GET", "/health").status == 503; }, 5));
  // A wrong method is the router's own answer, with the methods allowed.
  const auto wrong = test::http_request(port, "GET", "/v1/completions");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.headers.count("allow") ? wrong.headers.at("allow") : "", "POST");
}

// One worker dead at start: the router serves with the other at once (it
// waited the whole --startup-timeout, 20 s here) and lets the dead one in
// when it comes up.
TEST(Router, StartsWithTheFirstUsableWorkerAndLetsTheOthersInLater) {
  REQUIRE_SHARED();
  Worker w0, w1;
  w0.start();
  const double t0 = sched::steady_now();
  KvsProcess router({"router", "-m", stories(), "--port", "0", "--cluster-secret", secret_file(), "--health-interval",
                     "0.2", "--startup-timeout", "20", "--worker", w0.spec(), "--worker", w1.spec()},
                    "kvserve router: listening on", 8);
  EXPECT_LT(sched::steady_now() - t0, 8);
  EXPECT_NE(router.log().find("worker " + w1.url() + " is down"), std::string::npos) << router.log();
  EXPECT_EQ(complete(router.port(), "Once upon a time", 2).status, 200);
  w1.start();
  EXPECT_TRUE(eventually(
      [&] { return test::metric_value(router.port(), "kvserve_router_worker_up{worker=\"" + w1.url() + "\"}") == 1; },
      10));
}

// The workers' other routes answer through the router as they do directly
// (they were all 404 "no route"): a model by id, the token tools, and the
// Responses API, whose stored responses live on the worker that made them:
// a follow-up turn, a retrieve and a delete find that worker whichever it
// is (the stateless routes rotate over both workers).
TEST(Router, WorkerRoutesAnswerThroughTheRouterAndStoredResponsesAreFound) {
  REQUIRE_SHARED();
  TwoWorkers c;
  const int port = c.port;
  EXPECT_EQ(test::http_request(port, "GET", "/v1/models/stories260K").status, 200);
  const std::vector<std::pair<std::string, json>> tools = {
      {"/tokenize", {{"content", "Once upon a time"}}},
      {"/detokenize", {{"tokens", {100, 200}}}},
      {"/apply-template", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}}};
  for (const auto& [path, body] : tools) {
    const auto direct = test::http_request(c.w0.http, "POST", path, body.dump());
    const auto routed = test::http_request(port, "POST", path, body.dump());
    EXPECT_EQ(routed.status, direct.status) << path << ": " << routed.body;
    EXPECT_EQ(routed.body, direct.body) << path;
  }
  const json first = {{"input", "Once upon a time"}, {"max_output_tokens", 3}, {"temperature", 0}};
  auto rep = test::http_request(port, "POST", "/v1/responses", first.dump());
  ASSERT_EQ(rep.status, 200) << rep.body;
  std::string id = json::parse(rep.body)["id"];
  for (int turn = 0; turn < 4; ++turn) {
    const json next = {{"input", "And then?"}, {"max_output_tokens", 3}, {"previous_response_id", id}};
    rep = test::http_request(port, "POST", "/v1/responses", next.dump());
    ASSERT_EQ(rep.status, 200) << "turn " << turn << ": " << rep.body;
    EXPECT_EQ(test::http_request(port, "GET", "/v1/responses/" + id).status, 200) << "turn " << turn;
    id = json::parse(rep.body)["id"];
  }
  EXPECT_EQ(test::http_request(port, "DELETE", "/v1/responses/" + id).status, 200);
  rep = test::http_request(port, "GET", "/v1/responses/" + id);
  EXPECT_EQ(rep.status, 404) << rep.body;
  EXPECT_EQ(json::parse(rep.body)["error"]["code"], "response_not_found") << rep.body;
  // What the router cannot route right it says so, not "no route".
  rep = test::http_request(port, "POST", "/admin/tenants/t1/revoke");
  EXPECT_EQ(rep.status, 404);
  EXPECT_EQ(json::parse(rep.body)["error"]["code"], "not_routed") << rep.body;
}

// /health is a readiness answer: "ok" only when a request can be served.
// In prefill/decode mode two workers up are not enough; without a usable
// pair (here: plain workers, which have no KV address) or without a prefill
// worker, every completion is 503 and so is /health, with the reason.
TEST(Router, HealthIs503WhenNoPrefillDecodePairCanServe) {
  REQUIRE_SHARED();
  Worker pre, dec;
  pre.start();
  dec.start();
  KvsProcess router({"router", "-m", stories(), "--port", "0", "--cluster-secret", secret_file(), "--health-interval",
                     "0.2", "--startup-timeout", "20", "--prefill-worker", pre.url(), "--decode-worker", dec.url()},
                    "kvserve router: listening on", 30);
  const int port = router.port();
  const auto none = complete(port, "Once upon a time", 2);
  EXPECT_EQ(none.status, 503);
  EXPECT_EQ(none.headers.count("retry-after") ? none.headers.at("retry-after") : "", "1");
  auto h = test::http_request(port, "GET", "/health");
  EXPECT_EQ(h.status, 503) << h.body;
  json j = json::parse(h.body);
  EXPECT_EQ(j["status"], "no_worker");
  EXPECT_EQ(j["workers_up"], 2);
  EXPECT_NE(j.value("reason", "").find("no prefill/decode pair can serve"), std::string::npos) << h.body;
  pre.p->kill9();
  ASSERT_TRUE(eventually(
      [&] { return test::metric_value(port, "kvserve_router_worker_up{worker=\"" + pre.url() + "\"}") == 0; }, 10));
  h = test::http_request(port, "GET", "/health");
  EXPECT_EQ(h.status, 503) << h.body;
  EXPECT_NE(json::parse(h.body).value("reason", "").find("no prefill worker is up"), std::string::npos) << h.body;
}

// Request headers: what a worker takes (64 KiB) the router takes, and above
// that it answers the worker's 431 (it closed the connection without a
// word on anything over 8 KiB: large cookies or tokens failed only here).
TEST(Router, LargeHeadersAreAcceptedAsTheWorkerAcceptsThem) {
  REQUIRE_SHARED();
  Worker w0;
  w0.start();
  auto r = start_router({w0.spec()});
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 1}}.dump();
  for (const size_t n : {9000, 40000}) {
    const auto rep = test::http_request(r->port(), "POST", "/v1/completions", body, {{"X-Big", std::string(n, 'b')}}, 30);
    EXPECT_EQ(rep.status, 200) << n << ": " << rep.body;
  }
  for (const int port : {r->port(), w0.http}) {
    const auto rep = test::http_request(port, "POST", "/v1/completions", body, {{"X-Big", std::string(70000, 'b')}}, 30);
    EXPECT_EQ(rep.status, 431) << port;
    const json j = json::parse(rep.body, nullptr, false);
    EXPECT_EQ(j.is_object() ? j["error"]["code"] : json(), "headers_too_large") << rep.body;
  }
}

// A prefill worker's --decode-peer and a decode worker's --kv-listen spelt
// differently (a host name and its address) are one peer: the router pairs
// them by address and sends the prefill worker its own spelling. It
// compared the strings, so every request was 503 although the prefill
// worker ships to that decode worker fine.
TEST(Router, PrefillDecodePairsByAddressNotBySpelling) {
  REQUIRE_SHARED();
  const int dec_http = test::free_port(), ucx = test::free_port(), pre_http = test::free_port();
  auto serve = [](int http, std::vector<std::string> extra, const std::string& ready) {
    std::vector<std::string> a = {"serve", "-m", stories(), "--port", std::to_string(http), "--threads", "1",
                                  "--cache-secret-file", secret_file()};
    a.insert(a.end(), extra.begin(), extra.end());
    return std::make_unique<KvsProcess>(a, ready);
  };
  auto dec = serve(dec_http, {"--role", "decode", "--kv-listen", "127.0.0.1:" + std::to_string(ucx)},
                   "kvserve: role decode");
  auto pre = serve(pre_http, {"--role", "prefill", "--decode-peer", "localhost:" + std::to_string(ucx)},
                   "kvserve: role prefill");
  KvsProcess router({"router", "-m", stories(), "--port", "0", "--cluster-secret", secret_file(), "--health-interval",
                     "0.2", "--startup-timeout", "20", "--prefill-worker",
                     "http://127.0.0.1:" + std::to_string(pre_http), "--decode-worker",
                     "http://127.0.0.1:" + std::to_string(dec_http)},
                    "kvserve router: listening on", 30);
  ASSERT_TRUE(eventually([&] { return test::http_request(router.port(), "GET", "/health").status == 200; }, 10))
      << test::http_request(router.port(), "GET", "/health").body;
  const auto rep = complete(router.port(), prefix(0), 4);
  EXPECT_EQ(rep.status, 200) << rep.body;
  EXPECT_GT(test::metric_value(dec_http, "kvserve_kv_transfer_bytes_total{role=\"decode\"}"), 0);
}

// Both workers admit one request and let none wait (--max-queue 0). While
// a client keeps each of them busy, a request through the router is tried
// on one worker, then the other, and answered 429 with a Retry-After (never
// 502/503, never a hang); once the load drains it is served.
TEST(Router, AllWorkersSaturatedIs429WithRetryAfter) {
  REQUIRE_SHARED();
  TwoWorkers c({"--max-seqs", "1", "--max-queue", "0", "--max-request-share", "1"});
  const int port = c.port;
  Worker &w0 = c.w0, &w1 = c.w1;
  std::atomic<bool> stop{false};
  std::vector<std::thread> fill;
  for (const Worker* w : {&w0, &w1})
    fill.emplace_back([&stop, w] {
      const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 480}, {"ignore_eos", true}};
      while (!stop) test::http_request(w->http, "POST", "/v1/completions", body.dump(), {}, 60);
    });
  test::HttpReply busy;
  for (int i = 0; i < 40 && busy.status != 429; ++i) {
    const auto rep = complete(port, "The sun " + std::to_string(i), 2);
    EXPECT_TRUE(rep.status == 200 || rep.status == 429) << rep.status << " " << rep.body;
    if (rep.status == 429) busy = rep;
  }
  stop = true;
  for (auto& t : fill) t.join();
  ASSERT_EQ(busy.status, 429) << "both workers were never busy at once";
  ASSERT_TRUE(busy.headers.count("retry-after"));
  EXPECT_GE(std::stoi(busy.headers["retry-after"]), 1);
  EXPECT_EQ(json::parse(busy.body)["error"]["type"], "rate_limit_error");
  // Each worker was tried once for that request, and the router counted it.
  EXPECT_GE(test::metric_value(port, routed_to(w0.url(), 429)), 1);
  EXPECT_GE(test::metric_value(port, routed_to(w1.url(), 429)), 1);
  EXPECT_GE(test::metric_value(port, "kvserve_router_retries_total"), 1);
  EXPECT_GE(test::metric_value(port, "kvserve_router_saturated_total"), 1);
  EXPECT_EQ(test::metric_value(port, "kvserve_router_no_worker_total"), 0);
  EXPECT_EQ(complete(port, "Once upon a time", 4).status, 200);
}

TEST(Router, StalledStreamEndsWithAnErrorEventAndDone) {
  REQUIRE_SHARED();
  Worker w0;
  w0.start();
  auto r = start_router({w0.spec()}, {"--read-timeout", "1"});
  const int port = r->port();
  // A raw client: read until the first event, then freeze the worker.
  const int fd = test::connect_local(port, 30);
  ASSERT_GE(fd, 0);
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}}.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                          "application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_TRUE(test::send_all(fd, req));
  std::string got;
  char buf[4096];
  while (got.find("data: {") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, size_t(n));
  }
  kill(w0.p->pid(), SIGSTOP);
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
  close(fd);
  kill(w0.p->pid(), SIGCONT);
  // Cut after its first event: an error event, never a silent end.
  EXPECT_EQ(got.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(got.find("worker_failed"), std::string::npos) << got.substr(got.size() > 600 ? got.size() - 600 : 0);
  EXPECT_EQ(test::metric_value(port, "kvserve_router_midstream_errors_total"), 1);
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(got.find("\r\n0\r\n\r\n"), std::string::npos);  // a complete chunked body
}

// Each event goes on as the worker sends it: the router once read a
// streamed body into a 16 KiB buffer before passing any of it on, so a
// client saw short answers arrive all at once at the end.
TEST(Router, StreamedEventsArePassedOnAsTheyCome) {
  REQUIRE_SHARED();
  Worker w0;
  w0.start();
  auto r = start_router({w0.spec()});
  const int fd = test::connect_local(r->port(), 30);
  ASSERT_GE(fd, 0);
  const std::string body =
      json{{"prompt", "Once upon a time"}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true}}.dump();
  ASSERT_TRUE(test::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                                 "application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
                                 body));
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
  close(fd);
  // The chunk sizes of the router's chunked body.
  std::vector<size_t> chunks;
  size_t at = got.find("\r\n\r\n");
  ASSERT_NE(at, std::string::npos);
  for (at += 4; at < got.size();) {
    const size_t eol = got.find("\r\n", at);
    ASSERT_NE(eol, std::string::npos);
    const size_t len = std::stoul(got.substr(at, eol - at), nullptr, 16);
    if (len == 0) break;
    chunks.push_back(len);
    at = eol + 2 + len + 2;
  }
  ASSERT_FALSE(chunks.empty());
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos);
  // 300 events of about 200 bytes: a buffering relay sends 16 KiB pieces.
  EXPECT_LT(chunks.front(), 8192u) << chunks.size() << " chunks";
  EXPECT_GE(chunks.size(), 10u);
}

TEST(Router, ClientLeavingMidStreamCancelsTheWorkersRequest) {
  REQUIRE_SHARED();
  Worker w0;
  w0.start();
  auto r = start_router({w0.spec()});
  const int port = r->port();
  const auto rep = complete(port, "Once upon a time", 480, true, 300);
  EXPECT_EQ(rep.status, 200);
  EXPECT_TRUE(eventually([&] { return test::metric_value(w0.http, "kvserve_client_disconnects_total") >= 1; }, 10));
  EXPECT_TRUE(eventually(
      [&] {
        return test::metric_value(w0.http, "kvserve_running_requests") == 0 &&
               test::metric_value(w0.http, "kvserve_kv_blocks_used") == 0;
      },
      10));
}

TEST(Router, BadOrStoppedEventStreamsAreCountedAndStillRoutable) {
  REQUIRE_SHARED();
  Worker w0;
  w0.with_events = false;
  w0.start();
  // The worker's "event stream" is this test's PUB socket.
  zmq::context_t ctx;
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.bind("tcp://127.0.0.1:*");
  const std::string ep = pub.get(zmq::sockopt::last_endpoint);
  auto r = start_router({w0.url() + "," + ep + "," + Worker::ep(test::free_port())}, {"--events-stale", "1"});
  const int port = r->port();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the router's SUB joins
  auto send = [&](std::vector<std::string> frames) {
    std::vector<zmq::const_buffer> parts;
    for (const auto& f : frames) parts.push_back(zmq::buffer(f));
    zmq::send_multipart(pub, parts);
  };
  auto seq = [](int64_t s) {
    std::string b(8, '\0');
    for (int i = 7; i >= 0; --i, s >>= 8) b[size_t(i)] = char(s & 0xff);
    return b;
  };
  send({"", "short"});                                               // not [topic, seq, payload]
  send({"", seq(0), "\xc1 not msgpack"});                            // bad payload
  send({"", seq(0), events::encode_batch(1, {}, 16, true)});        // the start: AllBlocksCleared
  KvEvent e;
  e.key[31] = 1;
  send({"", seq(1), events::encode_batch(2, {e}, 16)});
  send({"", seq(1), events::encode_batch(2, {e}, 16)});             // replayed: ignored
  const std::string w = "{worker=\"" + w0.url() + "\"}";
  ASSERT_TRUE(eventually([&] { return test::metric_value(port, "kvserve_router_events_batches_total" + w) == 2; }, 5));
  EXPECT_EQ(test::metric_value(port, "kvserve_router_events_malformed_total" + w), 2);
  EXPECT_EQ(test::metric_value(port, "kvserve_router_events_duplicates_total" + w), 1);
  EXPECT_EQ(test::metric_value(port, "kvserve_router_index_blocks"), 1);
  // Requests routed while the stream says nothing: after --events-stale the
  // worker counts as holding nothing, and it still serves.
  ASSERT_EQ(complete(port, "Once upon a time", 2).status, 200);
  EXPECT_TRUE(eventually([&] { return test::metric_value(port, "kvserve_router_events_live" + w) == 0; }, 5));
  EXPECT_EQ(complete(port, "Once upon a time", 2).status, 200);
}
