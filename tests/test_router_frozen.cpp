// `kvserve router` over a worker that freezes (SIGSTOP, a GC pause, a swap
// storm): its sockets stay open and it answers nothing, so only the health
// checker's verdict ends the wait. A request with no byte of its answer yet
// fails over to another worker; a stream under way ends with an error event
// and [DONE] (never replayed: the client has tokens); a non-streamed answer
// under way is a 502. Each used to wait for --read-timeout (600 s).
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "router_fixture.h"
#include "sched/clock.h"

using namespace kvs;
using namespace kvs::router_test;

namespace {

// A raw client that posts `body` and reads until `until` appears (or the
// connection ends, or a read waits 30 s); what it read.
std::string read_until(int fd, const std::string& until) {
  std::string got;
  char buf[4096];
  while (got.find(until) == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  return got;
}

int post_raw(int port, const std::string& body) {
  const int fd = test::connect_local(port, 30);
  if (fd < 0) return fd;
  test::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                     "application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  return fd;
}

// A stand-in worker on a loopback port: /health answers as the real worker
// whose body it was given, until a completion arrives; that gets the head
// of a 200 and a few bytes of its body, and from then on the stub is
// frozen: it holds every connection open and answers nothing.
class FreezingStub {
 public:
  explicit FreezingStub(std::string health_body) : health_(std::move(health_body)) {
    lfd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    ::listen(lfd_, 64);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~FreezingStub() {
    stop_ = true;
    thread_.join();
    for (int fd : held_) ::close(fd);
    ::close(lfd_);
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void run() {
    while (!stop_) {
      timeval tv{0, 100000};
      fd_set fds;
      FD_ZERO(&fds);
      FD_SET(lfd_, &fds);
      if (::select(lfd_ + 1, &fds, nullptr, nullptr, &tv) <= 0) continue;
      const int c = ::accept(lfd_, nullptr, nullptr);
      if (c < 0) continue;
      char buf[8192];
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      const std::string req = n > 0 ? std::string(buf, size_t(n)) : "";
      if (frozen_) {
        held_.push_back(c);
        continue;
      }
      if (req.rfind("POST /v1/completions", 0) == 0) {
        reply(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{\"id\":\"cmpl-");
        frozen_ = true;
        held_.push_back(c);
        continue;
      }
      const std::string body = req.rfind("GET /health", 0) == 0 ? health_ : "";
      reply(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                   "\r\nConnection: close\r\n\r\n" + body);
      ::close(c);
    }
  }
  static void reply(int c, const std::string& s) { (void)::send(c, s.data(), s.size(), MSG_NOSIGNAL); }

  std::string health_;
  int lfd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false}, frozen_{false};
  std::vector<int> held_;
  std::thread thread_;
};

}  // namespace

// A worker frozen (SIGSTOP) after taking a request: once the health check
// marks it down (about 2 s: its /health times out), the request, which has
// no byte of its answer yet, goes to the other worker. It waited for the
// 600 s read timeout.
TEST(RouterFrozen, ARequestOnAFrozenWorkerFailsOverWhenItIsMarkedDown) {
  REQUIRE_SHARED();
  TwoWorkers c({}, {"--policy", "round-robin"});
  const int port = c.port;
  ASSERT_EQ(complete(port, "Once upon a time", 2).status, 200);
  kill(c.w0.p->pid(), SIGSTOP);
  // Round-robin: one of two requests sent at once goes to the frozen worker.
  std::vector<test::HttpReply> reps(2);
  std::vector<std::thread> ts;
  const double t0 = sched::steady_now();
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&, i] {
      const json body = {{"prompt", "Frozen " + std::to_string(i)}, {"max_tokens", 2}};
      reps[size_t(i)] = test::http_request(port, "POST", "/v1/completions", body.dump(), {}, 20);
    });
  for (auto& t : ts) t.join();
  const double took = sched::steady_now() - t0;
  kill(c.w0.p->pid(), SIGCONT);
  for (const auto& r : reps) EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_LT(took, 10);
  EXPECT_GE(test::metric_value(port, "kvserve_router_retries_total"), 1);
}

// A stream under way when its worker freezes: the health check marks the
// worker down within about 2 s, and the stream, silent since, ends with an
// error event in OpenAI's shape and [DONE], well before --read-timeout (the
// default, 600 s, here). It hung for the whole read timeout.
TEST(RouterFrozen, AStreamOnAFrozenWorkerEndsOnceItIsMarkedDown) {
  REQUIRE_SHARED();
  Worker w0;
  w0.model = tiny_llama();  // about 1 ms a token: a 3,000-token stream is still running when frozen
  w0.extra = {"--ctx", "4096"};
  w0.start();
  KvsProcess router({"router", "-m", tiny_llama(), "--port", "0", "--cluster-secret", secret_file(),
                     "--health-interval", "0.2", "--startup-timeout", "20", "--worker", w0.spec()},
                    "kvserve router: listening on", 30);
  const int fd = post_raw(router.port(), json{{"prompt", "Once upon a time"},
                                              {"max_tokens", 3000},
                                              {"ignore_eos", true},
                                              {"stream", true}}
                                             .dump());
  ASSERT_GE(fd, 0);
  std::string got = read_until(fd, "data: {");
  ASSERT_NE(got.find("data: {"), std::string::npos) << got;
  kill(w0.p->pid(), SIGSTOP);
  const double t0 = sched::steady_now();
  got += read_until(fd, "\r\n0\r\n\r\n");
  const double took = sched::steady_now() - t0;
  close(fd);
  const double midstream = test::metric_value(router.port(), "kvserve_router_midstream_errors_total");
  kill(w0.p->pid(), SIGCONT);
  w0.p->kill9();
  const std::string tail = got.substr(got.size() > 800 ? got.size() - 800 : 0);
  EXPECT_LT(took, 10) << tail;
  EXPECT_EQ(got.find("\"finish_reason\":\"length\""), std::string::npos) << "the stream finished before the freeze";
  const size_t err = got.find("data: {\"error\":");
  ASSERT_NE(err, std::string::npos) << tail;
  const json e = json::parse(got.substr(err + 6, got.find('\n', err) - err - 6));
  EXPECT_EQ(e["error"]["code"], "worker_failed");
  EXPECT_EQ(e["error"]["type"], "server_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("marked down"), std::string::npos) << e.dump();
  EXPECT_NE(got.find("data: [DONE]", err), std::string::npos) << tail;
  EXPECT_NE(got.find("\r\n0\r\n\r\n"), std::string::npos) << tail;  // a complete chunked body
  EXPECT_EQ(midstream, 1);
}

// A non-streamed answer whose head and first bytes came before the worker
// froze: once the health check marks the worker down the client gets a 502
// naming it (nothing of the answer reached the client). It waited 600 s.
TEST(RouterFrozen, ANonStreamedAnswerInProgressIs502OnceTheWorkerIsMarkedDown) {
  REQUIRE_SHARED();
  Worker real;
  real.with_events = false;
  real.start();
  const test::HttpReply h = test::http_request(real.http, "GET", "/health");
  ASSERT_EQ(h.status, 200);
  FreezingStub stub(h.body);
  KvsProcess router({"router", "-m", stories(), "--port", "0", "--cluster-secret", secret_file(), "--health-interval",
                     "0.2", "--startup-timeout", "20", "--worker", stub.url()},
                    "kvserve router: listening on", 30);
  const double t0 = sched::steady_now();
  const test::HttpReply rep = test::http_request(
      router.port(), "POST", "/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 4}}.dump(), {}, 30);
  const double took = sched::steady_now() - t0;
  EXPECT_EQ(rep.status, 502) << rep.body;
  EXPECT_LT(took, 10);
  const json j = json::parse(rep.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << rep.body;
  EXPECT_EQ(j["error"]["code"], "worker_failed");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("marked down"), std::string::npos) << rep.body;
}
