#include "router/router_server.h"

#include <utility>  // std::exchange, used by Boost.Asio 1.74 headers under C++20
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <limits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>
#include <cerrno>
#include <sys/socket.h>

#include "router/pd_choice.h"
#include "router/router_dashboard.h"
#include "sched/clock.h"
#include "server/dashboard_hub.h"
#include "server/dashboard_page.h"
#include "server/http_response.h"
#include "server/openai_codec.h"
#include "server/sse_stream.h"
#include "server/tcp_listen.h"

namespace kvs::router {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr std::string_view kServer = "kvserve-router";

// retry_after / allow: the Retry-After and Allow headers (a 429 / 503, a 405).
std::string respond(int status, const std::string& type, const std::string& body, bool keep_alive,
                    const std::string& retry_after = "", const std::string& allow = "") {
  server::HttpResponse r{status, type, body, {}};
  if (!retry_after.empty()) r.headers.emplace_back("Retry-After", retry_after);
  if (!allow.empty()) r.headers.emplace_back("Allow", allow);
  return server::full_response(r, kServer, keep_alive);
}

std::string error_json(const std::string& type, const std::string& code, const std::string& msg) {
  server::ApiError e;
  e.type = type;
  e.code = code;
  e.message = msg;
  return server::error_body(e);
}

// What one forwarding attempt came to.
struct Relay {
  int status = 0;
  bool failover = false;      // nothing reached the client; the worker failed before its first byte
  bool sent = false;          // the client has the response (or its start)
  bool client_gone = false;
  std::string error;          // why the worker failed
  std::string body, content_type = "application/json", retry_after;  // a held (unsent) answer
  int64_t cached_tokens = -1; // usage.prompt_tokens_details.cached_tokens seen in the answer
  bool counted = false;       // in kvserve_router_requests_total already
};

// The last "cached_tokens": N in `text`, or -1.
int64_t scan_cached(const std::string& text) {
  static const std::string kKey = "\"cached_tokens\":";
  const size_t at = text.rfind(kKey);
  if (at == std::string::npos) return -1;
  size_t p = at + kKey.size();
  while (p < text.size() && text[p] == ' ') ++p;
  int64_t v = 0;
  bool any = false;
  for (; p < text.size() && std::isdigit(static_cast<unsigned char>(text[p])); ++p, any = true) v = v * 10 + (text[p] - '0');
  return any ? v : -1;
}

// Runs one asynchronous operation to completion on `ioc`. Sync Asio calls
// ignore a stream's expiry; async ones end at the deadline with
// beast::error::timeout, so every socket step here goes through this.
template <class Start>
beast::error_code await(net::io_context& ioc, Start&& start) {
  beast::error_code out = net::error::operation_aborted;
  start([&out](beast::error_code ec, auto&&...) { out = ec; });
  ioc.restart();
  ioc.run();
  return out;
}

// One client connection: its own io_context, run by its thread.
struct Conn {
  net::io_context ioc;
  beast::tcp_stream stream{ioc};
};

// 502 for a prefill/decode leg whose worker failed before answering.
std::string leg_failed(const std::string& which, const Relay& r, bool keep_alive) {
  return respond(502, "application/json",
                 error_json("server_error", "worker_failed", "the " + which + " worker failed (" + r.error + ")"),
                 keep_alive);
}

bool is_completion(const std::string& path) {
  return path == "/v1/completions" || path == "/completions" || path == "/v1/chat/completions" ||
         path == "/chat/completions";
}

}  // namespace

struct RouterServer::Impl : std::enable_shared_from_this<RouterServer::Impl> {
  WorkerSet& workers;
  PrefixIndex& index;
  EventListener& events;
  const RequestHasher& hasher;
  RouterOptions opts;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::thread accept_thread;
  std::atomic<bool> stopping{false};
  std::atomic<int> connections{0};
  std::atomic<uint64_t> turn{0};
  // One snapshot per second for every open dashboard stream.
  RouterDashboard dash{workers};
  server::DashboardHub hub{[this] { return dash.sample(sched::steady_now()); }};

  mutable std::mutex mu;  // the counters below
  std::map<std::pair<int, int>, int64_t> routed;  // (worker, status) -> requests
  int64_t retries = 0, midstream_errors = 0, no_worker = 0, saturated = 0, predicted_tokens = 0, actual_tokens = 0;
  int64_t rejected_connections = 0;

  Impl(WorkerSet& w, PrefixIndex& i, EventListener& e, const RequestHasher& h, RouterOptions o)
      : workers(w), index(i), events(e), hasher(h), opts(std::move(o)) {}

  void accept_loop();
  void serve(tcp::socket sock);
  // Handles one request; false when the connection must close.
  bool handle(Conn& client, http::request<http::string_body>& req);
  bool proxy(Conn& client, const http::request<http::string_body>& req, bool keep_alive);
  // GET /health: 200 "ok" when a request can be served now (a worker up; in
  // P/D mode a usable prefill/decode pair), else 503 with the reason.
  bool health(Conn& client, bool keep_alive);
  // 503 naming why each worker could not take the request (`reasons`: the
  // ones tried; the untried ones are down).
  bool answer_no_worker(Conn& client, const std::vector<bool>& tried, std::string reasons, bool keep_alive);
  // forward == false: the answer is read into the Relay, never sent (the
  // prefill leg of a P/D request).
  Relay relay(int w, const http::request<http::string_body>& in, Conn& client, bool keep_alive, bool forward = true);
  // Once per relay, in the totals by status (0: failed over).
  void count_routed(int w, Relay& r);
  // relay() counted: in flight on worker w meanwhile, then in the totals by
  // status; a worker that failed before its first byte is marked down.
  Relay leg(int w, const http::request<http::string_body>& in, Conn& client, bool keep_alive, bool forward = true);
  bool proxy_pd(Conn& client, const http::request<http::string_body>& req, bool keep_alive);
  // Connects to worker w and sends the request; false (r.failover set) on failure.
  bool send_upstream(int w, const http::request<http::string_body>& in, Conn& c, beast::tcp_stream& up, Relay& r);
  void stream_body(int w, Conn& client, beast::tcp_stream& up, beast::flat_buffer& buf,
                   http::response_parser<http::buffer_body>& p, bool keep_alive, Relay& r);
  // The next piece of a relayed body into tmp (at most n bytes, under the
  // read deadline): whatever the worker has sent so far, not a full buffer,
  // so each SSE event goes on as it comes. How many bytes came; `ec` is set
  // when the read failed.
  size_t read_piece(Conn& client, beast::tcp_stream& up, beast::flat_buffer& buf,
                    http::response_parser<http::buffer_body>& p, char* tmp, size_t n, beast::error_code& ec) {
    p.get().body().data = tmp;
    p.get().body().size = n;
    up.expires_after(sched::seconds_ms(opts.read_timeout_s));
    ec = await(client.ioc, [&](auto h) { http::async_read_some(up, buf, p, h); });
    if (ec == http::error::need_buffer) ec = {};
    return n - p.get().body().size;
  }
  std::string metrics() const;
  // GET /dashboard/events: the latest snapshot, then one per second, until
  // the client or the router goes away.
  bool dashboard_events(Conn& client);
  bool write(Conn& client, const std::string& bytes) {
    client.stream.expires_after(sched::seconds_ms(opts.client_timeout_s));
    return !await(client.ioc, [&](auto h) { net::async_write(client.stream, net::buffer(bytes), h); });
  }
};

void RouterServer::Impl::accept_loop() {
  while (!stopping) {
    beast::error_code ec;
    tcp::socket s(ioc);
    acceptor.accept(s, ec);
    if (ec) {
      if (stopping) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // out of descriptors and the like
      continue;
    }
    if (connections.load() >= opts.max_connections) {
      const std::string r = respond(503, "application/json",
                                    error_json("service_unavailable", "too_many_connections",
                                               "the router has too many open connections"),
                                    false);
      net::write(s, net::buffer(r), ec);
      std::lock_guard lk(mu);
      ++rejected_connections;
      continue;
    }
    ++connections;
    std::thread([self = shared_from_this(), s = std::move(s)]() mutable {
      try {
        self->serve(std::move(s));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kvserve router: connection: %s\n", e.what());
      }
      --self->connections;
    }).detach();
  }
}

void RouterServer::Impl::serve(tcp::socket sock) {
  Conn client;
  client.stream.socket().assign(tcp::v4(), sock.release());
  beast::error_code nd;
  client.stream.socket().set_option(tcp::no_delay(true), nd);
  beast::flat_buffer buf;
  while (!stopping) {
    http::request_parser<http::string_body> p;
    p.body_limit(opts.body_limit);
    // The workers' limit (server/http_server.h): what a worker accepts
    // directly it accepts through the router (Beast's default is 8 KiB).
    p.header_limit(std::uint32_t(opts.header_limit));
    client.stream.expires_after(sched::seconds_ms(opts.client_timeout_s));
    const beast::error_code ec = await(client.ioc, [&](auto h) { http::async_read(client.stream, buf, p, h); });
    // As the worker answers them, so a client sees one behaviour either way.
    if (ec == http::error::body_limit) {
      write(client, respond(413, "application/json",
                            error_json("invalid_request_error", "request_too_large",
                                       "the request body exceeds the limit"),
                            false));
      break;
    }
    if (ec == http::error::header_limit) {
      write(client, respond(431, "application/json",
                            error_json("invalid_request_error", "headers_too_large",
                                       "the request headers exceed the limit"),
                            false));
      break;
    }
    if (ec) break;
    auto& req = p.get();
    if (!handle(client, req) || !req.keep_alive()) break;
  }
  beast::error_code ec;
  client.stream.socket().shutdown(tcp::socket::shutdown_both, ec);
}

bool RouterServer::Impl::handle(Conn& client, http::request<http::string_body>& req) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const bool keep = req.keep_alive();
  if (path == "/health") return health(client, keep);
  if (path == "/metrics" && req.method() == http::verb::get) {
    return write(client, respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics(), keep));
  }
  if (is_completion(path)) {
    if (req.method() != http::verb::post)
      return write(client, respond(405, "application/json",
                                   error_json("invalid_request_error", "method_not_allowed", "use POST"), keep, "",
                                   "POST"));
    if (!opts.prefill_workers.empty()) return proxy_pd(client, req, keep);
    return proxy(client, req, keep);
  }
  if (path == "/v1/models" || path == "/models") return proxy(client, req, keep);
  if (path == "/dashboard" && req.method() == http::verb::get)
    return write(client, respond(200, "text/html; charset=utf-8", server::dashboard_html(), keep));
  if (path == "/dashboard/snapshot" && req.method() == http::verb::get)
    return write(client, respond(200, "application/json", hub.latest(), keep));
  if (path == "/dashboard/events" && req.method() == http::verb::get) return dashboard_events(client);
  return write(client, respond(404, "application/json",
                               error_json("not_found_error", "not_found", "no route for " + path), keep));
}

// Ready only when a request could be served now: a readiness probe that
// saw "ok" while every completion got 503 kept sending traffic here.
bool RouterServer::Impl::health(Conn& client, bool keep_alive) {
  const std::vector<WorkerView> view = workers.snapshot();
  int up = 0;
  std::string why;
  for (int i = 0; i < int(view.size()); ++i) {
    up += view[size_t(i)].up;
    if (!view[size_t(i)].up)
      why += (why.empty() ? "" : "; ") + workers.spec(i).url + ": " + view[size_t(i)].down_reason;
  }
  bool ok = up > 0;
  if (!ok) why = "no worker is up (" + why + ")";
  if (ok && !opts.prefill_workers.empty()) {
    ok = choose_pd(view, opts.prefill_workers, opts.decode_workers, 0, &why).has_value();
    if (!ok) why = "no prefill/decode pair can serve: " + why;
  }
  nlohmann::json j = {{"status", ok ? "ok" : "no_worker"}, {"workers_up", up}, {"workers", workers.size()}};
  if (!ok) j["reason"] = why;
  return write(client, respond(ok ? 200 : 503, "application/json", j.dump(), keep_alive));
}

bool RouterServer::Impl::proxy(Conn& client, const http::request<http::string_body>& req,
                               bool keep_alive) {
  const std::string target(req.target());
  const bool completion = req.method() == http::verb::post;
  const PromptHashes ph = completion ? hasher.hash(target, req.body(), std::string(req[http::field::authorization]))
                                     : PromptHashes{};
  const int n = workers.size();
  std::vector<bool> tried(size_t(n), false);
  std::string reasons;
  std::optional<Relay> held;  // a 429 kept while another worker is tried
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::vector<WorkerView> view = workers.snapshot();
    const std::vector<int> hits = index.leading_hits(ph.hashes, n);
    std::vector<Candidate> c(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      c[size_t(i)].up = view[size_t(i)].up;
      c[size_t(i)].load = view[size_t(i)].load;
      c[size_t(i)].hits = events.live(i) ? hits[size_t(i)] : 0;
    }
    const Policy pol = completion ? opts.policy : Policy::LeastLoad;
    const int w = choose(pol, c, int(ph.hashes.size()), opts.load_weight, turn++, tried);
    if (w < 0) break;
    tried[size_t(w)] = true;
    if (attempt > 0) {
      std::lock_guard lk(mu);
      ++retries;
    }
    events.routed(w);
    index.predict(w, ph.hashes);
    Relay r = leg(w, req, client, keep_alive);
    if (completion && !r.failover && r.status == 200) {
      std::lock_guard lk(mu);
      predicted_tokens += int64_t(c[size_t(w)].hits) * hasher.block_size();
      if (r.cached_tokens >= 0) actual_tokens += r.cached_tokens;
    }
    if (r.failover) {
      events.reset(w);
      reasons += (reasons.empty() ? "" : "; ") + workers.spec(w).url + ": " + r.error;
      continue;
    }
    if (r.client_gone) return false;
    if (!r.sent && r.status == 429) {
      if (!held || sooner_retry(r.retry_after, held->retry_after)) held = std::move(r);
      continue;
    }
    return r.sent ? keep_alive && r.status != 0 : false;
  }
  if (held) {
    {
      std::lock_guard lk(mu);
      ++saturated;
    }
    return write(client, respond(429, held->content_type, held->body, keep_alive, held->retry_after));
  }
  return answer_no_worker(client, tried, reasons, keep_alive);
}

bool RouterServer::Impl::answer_no_worker(Conn& client, const std::vector<bool>& tried, std::string reasons,
                                          bool keep_alive) {
  const std::vector<WorkerView> view = workers.snapshot();
  for (int i = 0; i < int(view.size()); ++i)
    if (!tried[size_t(i)] && !view[size_t(i)].up)
      reasons += (reasons.empty() ? "" : "; ") + workers.spec(i).url + ": " + view[size_t(i)].down_reason;
  {
    std::lock_guard lk(mu);
    ++no_worker;
  }
  return write(client, respond(503, "application/json",
                               error_json("service_unavailable", "no_worker",
                                          "no worker can take the request (" +
                                              (reasons.empty() ? std::string("none configured") : reasons) +
                                              ")"),
                               keep_alive));
}

// The prefill/decode pair with both workers up and the least load, ties
// in turn; -1 when none is.
namespace {

// `req` with `param` appended to its query string.
http::request<http::string_body> with_query(const http::request<http::string_body>& req, const std::string& param) {
  http::request<http::string_body> out = req;
  std::string target(req.target());
  target += (target.find('?') == std::string::npos ? "?" : "&") + param;
  out.target(target);
  return out;
}

}  // namespace

// Disaggregated serving: the prefill worker prefills, samples the first
// token and ships the K/V to the decode worker named in the request,
// answering with the hand-over; the decode worker, given it, streams the
// whole answer, which goes to the client as it comes. A prefill leg that
// answers 429 (the decode worker had no room) or 500 (it could not be
// reached) is tried once more per other decode worker; the prefill worker's
// prefix cache makes the repeat cheap, and nothing has reached the client
// yet. Any other answer but a hand-over (a 400, say) reaches the client as
// the prefill worker sent it.
bool RouterServer::Impl::proxy_pd(Conn& client, const http::request<http::string_body>& req, bool keep_alive) {
  std::vector<WorkerView> view = workers.snapshot();
  std::optional<Relay> last;
  for (size_t attempt = 0; attempt < opts.decode_workers.size(); ++attempt) {
    std::string why;
    const std::optional<PdChoice> pick = choose_pd(view, opts.prefill_workers, opts.decode_workers, turn++, &why);
    if (!pick && last) break;
    if (!pick) {
      {
        std::lock_guard lk(mu);
        ++no_worker;
      }
      return write(client, respond(503, "application/json", error_json("service_unavailable", "no_worker", why),
                                   keep_alive));
    }
    Relay pre = leg(pick->prefill, with_query(req, "kv_decode_peer=" + pick->decode_kv), client, keep_alive, false);
    if (pre.client_gone) return false;
    if (pre.failover) return write(client, leg_failed("prefill", pre, keep_alive));
    if (pre.status == 429 || pre.status == 500) {
      view[size_t(pick->decode)].up = false;
      if (!last || pre.status == 429) last = std::move(pre);  // a 429 tells the client when to come back
      std::lock_guard lk(mu);
      ++retries;
      continue;
    }
    const nlohmann::json h = nlohmann::json::parse(pre.body, nullptr, false);
    if (pre.status != 200 || !h.is_object() || h.value("object", "") != "kv.handover")
      return write(client, respond(pre.status == 200 ? 502 : pre.status, pre.content_type, pre.body, keep_alive,
                                   pre.retry_after));
    const std::string handover = "kv_handover=" + std::to_string(h.value("handle", uint64_t(0))) + "." +
                                 std::to_string(h.value("first_token", int64_t(-1))) + "." +
                                 std::to_string(h.value("draws", uint64_t(0))) + "." +
                                 std::to_string(h.value("seed", uint64_t(0)));
    Relay r = leg(pick->decode, with_query(req, handover), client, keep_alive);
    if (r.failover) return write(client, leg_failed("decode", r, keep_alive));
    if (r.client_gone) return false;
    if (!r.sent) return write(client, respond(r.status, r.content_type, r.body, keep_alive, r.retry_after));
    return keep_alive && r.status != 0;
  }
  return write(client, respond(last->status, last->content_type, last->body, keep_alive, last->retry_after));
}

Relay RouterServer::Impl::leg(int w, const http::request<http::string_body>& in, Conn& client, bool keep_alive,
                              bool forward) {
  workers.begin_request(w);
  Relay r = relay(w, in, client, keep_alive, forward);
  workers.end_request(w);
  count_routed(w, r);
  if (r.failover) workers.mark_down(w, r.error);
  return r;
}

// Counted before the client gets the first byte of the answer, so a client
// that reads /metrics after its response finds it counted.
void RouterServer::Impl::count_routed(int w, Relay& r) {
  if (r.counted) return;
  r.counted = true;
  std::lock_guard lk(mu);
  ++routed[{w, r.failover ? 0 : r.status}];
}

bool RouterServer::Impl::send_upstream(int w, const http::request<http::string_body>& in, Conn& c,
                                       beast::tcp_stream& up, Relay& r) {
  const HostPort& hp = workers.spec(w).http;
  beast::error_code ec;
  up.expires_after(sched::seconds_ms(opts.connect_timeout_s));
  // An address literal needs no resolver (getaddrinfo costs time per request).
  const auto addr = net::ip::make_address(hp.host, ec);
  if (!ec) {
    ec = await(c.ioc, [&](auto h) { up.async_connect(tcp::endpoint(addr, uint16_t(hp.port)), h); });
  } else {
    tcp::resolver res(c.ioc);
    const auto eps = res.resolve(hp.host, std::to_string(hp.port), ec);
    if (!ec) ec = await(c.ioc, [&](auto h) { up.async_connect(eps, h); });
  }
  // Small SSE chunks go out as they come, not after Nagle's wait.
  if (!ec) up.socket().set_option(tcp::no_delay(true), ec);
  if (ec) {
    r.failover = true;
    r.error = "connect: " + ec.message();
    return false;
  }
  http::request<http::string_body> out{in.method(), in.target(), 11};
  out.set(http::field::host, hp.host + ":" + std::to_string(hp.port));
  out.set(http::field::connection, "close");
  if (!in[http::field::authorization].empty()) out.set(http::field::authorization, in[http::field::authorization]);
  if (!in[http::field::content_type].empty()) out.set(http::field::content_type, in[http::field::content_type]);
  out.body() = in.body();
  out.prepare_payload();
  up.expires_after(sched::seconds_ms(opts.read_timeout_s));
  ec = await(c.ioc, [&](auto h) { http::async_write(up, out, h); });
  if (ec) {
    r.failover = true;
    r.error = "sending: " + ec.message();
    return false;
  }
  return true;
}

namespace {

// Until cancelled: when the client's socket turns readable, a hang-up (end
// of stream or an error) sets `left` and closes `up`; a pipelined request
// ends the watch and stays in the socket for the next read.
void watch_client(Conn& client, beast::tcp_stream& up, bool& left) {
  client.stream.socket().async_wait(tcp::socket::wait_read, [&client, &up, &left](beast::error_code ec) {
    if (ec) return;
    char c;
    const ssize_t n = ::recv(client.stream.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return watch_client(client, up, left);
    left = true;
    beast::error_code ignored;
    up.socket().close(ignored);
  });
}

}  // namespace

Relay RouterServer::Impl::relay(int w, const http::request<http::string_body>& in, Conn& client, bool keep_alive,
                                bool forward) {
  Relay r;
  beast::tcp_stream up(client.ioc);
  if (!send_upstream(w, in, client, up, r)) return r;
  beast::flat_buffer buf;
  http::response_parser<http::buffer_body> p;
  // No limit on a relayed answer; an explicit maximum rather than none,
  // which Boost 1.74 compares wrongly with a Content-Length.
  p.body_limit(std::numeric_limits<std::uint64_t>::max());
  // The worker may not answer for long (a prefill leg answers after the
  // whole prompt). A client that hangs up meanwhile closes the worker's
  // connection, so the worker cancels the request too.
  bool client_left = false;
  watch_client(client, up, client_left);
  beast::error_code ec = await(client.ioc, [&](auto h) {
    http::async_read_header(up, buf, p, [&client, h](beast::error_code e, size_t n) mutable {
      beast::error_code ignored;
      client.stream.socket().cancel(ignored);  // ends the watch
      h(e, n);
    });
  });
  if (client_left) {
    r.client_gone = true;
    return r;
  }
  if (ec) {
    r.failover = true;
    r.error = "before the first byte: " + ec.message();
    return r;
  }
  r.status = int(p.get().result_int());
  r.content_type = std::string(p.get()[http::field::content_type]);
  r.retry_after = std::string(p.get()[http::field::retry_after]);
  if (forward && r.content_type.rfind("text/event-stream", 0) == 0) {
    stream_body(w, client, up, buf, p, keep_alive, r);
    return r;
  }
  char tmp[16384];
  while (!ec && !p.is_done()) r.body.append(tmp, read_piece(client, up, buf, p, tmp, sizeof tmp, ec));
  if (ec) {
    // A plain answer cut short: nothing was sent yet, so it is a clear 502.
    r.status = 502;
    r.body = error_json("server_error", "worker_failed", "the worker's response was cut short (" + ec.message() + ")");
    r.content_type = "application/json";
  }
  r.cached_tokens = scan_cached(r.body);
  if (r.status == 429 || !forward) return r;  // held: the caller may try another worker, or reads it
  r.sent = true;
  count_routed(w, r);
  if (!write(client, respond(r.status, r.content_type.empty() ? "application/json" : r.content_type, r.body,
                             keep_alive, r.retry_after)))
    r.client_gone = true;
  return r;
}

void RouterServer::Impl::stream_body(int w, Conn& client, beast::tcp_stream& up, beast::flat_buffer& buf,
                                     http::response_parser<http::buffer_body>& p, bool keep_alive, Relay& r) {
  r.sent = true;
  count_routed(w, r);
  if (!write(client, server::stream_head(r.status, kServer, r.content_type, true, keep_alive))) {
    r.client_gone = true;
    return;
  }
  std::string tail;  // the last bytes seen, for the usage's cached_tokens
  char tmp[16384];
  beast::error_code ec;
  while (!ec && !p.is_done()) {
    const size_t got = read_piece(client, up, buf, p, tmp, sizeof tmp, ec);
    if (got == 0) continue;
    const std::string piece(tmp, got);
    tail = tail.size() > 256 ? tail.substr(tail.size() - 256) + piece : tail + piece;
    // A client that is gone: returning closes `up`, which hangs up on the
    // worker, and the worker cancels the request.
    if (!write(client, server::http_chunk(piece))) {
      r.client_gone = true;
      return;
    }
  }
  r.cached_tokens = scan_cached(tail);
  if (ec) {
    // The stream started: the client gets an error event and [DONE], never a silent cut.
    r.error = "mid-stream: " + ec.message();
    {
      std::lock_guard lk(mu);
      ++midstream_errors;
    }
    const std::string err = "data: " +
                            error_json("server_error", "worker_failed",
                                       "the worker serving this stream failed (" + ec.message() + ")") +
                            "\n\ndata: [DONE]\n\n";
    workers.mark_down(w, r.error);
    events.reset(w);
    if (!write(client, server::http_chunk(err))) r.client_gone = true;
  }
  if (!r.client_gone && !write(client, server::http_chunk(""))) r.client_gone = true;
}

bool RouterServer::Impl::dashboard_events(Conn& client) {
  if (!write(client, server::stream_head(200, kServer, "text/event-stream", false, false)))
    return false;
  std::string sent;
  while (!stopping) {
    const std::string snap = hub.latest();
    if (!snap.empty() && snap != sent) {
      if (!write(client, server::sse_data(snap))) return false;
      sent = snap;
    }
    for (int i = 0; i < 10 && !stopping; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

std::string RouterServer::Impl::metrics() const {
  std::string o;
  {
    std::lock_guard lk(mu);
    o += "# HELP kvserve_router_requests_total Requests forwarded, by worker and the worker's status (0: failed "
         "before answering).\n# TYPE kvserve_router_requests_total counter\n";
    for (const auto& [k, v] : routed)
      o += "kvserve_router_requests_total{worker=\"" + workers.spec(k.first).url + "\",status=\"" +
           std::to_string(k.second) + "\"} " + std::to_string(v) + "\n";
    auto counter = [&](const char* name, const char* help, int64_t v) {
      o += std::string("# HELP kvserve_router_") + name + " " + help + "\n# TYPE kvserve_router_" + name +
           " counter\nkvserve_router_" + name + " " + std::to_string(v) + "\n";
    };
    counter("retries_total", "Requests sent to a second worker after the first failed or answered 429.", retries);
    counter("midstream_errors_total", "Streams ended with an error event because their worker failed.",
            midstream_errors);
    counter("no_worker_total", "Requests answered 503: no worker could take them.", no_worker);
    counter("saturated_total",
            "Requests answered 429: every worker tried answered 429 (the soonest Retry-After passed on).", saturated);
    counter("predicted_cached_tokens_total", "Prompt tokens the index predicted cached on the chosen worker.",
            predicted_tokens);
    counter("actual_cached_tokens_total", "Cached prompt tokens the workers reported (usage, when present).",
            actual_tokens);
    counter("rejected_connections_total", "Connections refused over the connection limit.", rejected_connections);
  }
  o += "# HELP kvserve_router_index_blocks Distinct block hashes in the prefix index.\n"
       "# TYPE kvserve_router_index_blocks gauge\nkvserve_router_index_blocks " +
       std::to_string(index.size()) + "\n";
  return o + workers.metrics_text() + events.metrics_text();
}

RouterServer::RouterServer(WorkerSet& workers, PrefixIndex& index, EventListener& events, const RequestHasher& hasher,
                           RouterOptions opts)
    : impl_(std::make_shared<Impl>(workers, index, events, hasher, std::move(opts))) {}

RouterServer::~RouterServer() { stop(); }

void RouterServer::start() {
  Impl& m = *impl_;
  port_ = server::listen_on(m.acceptor, m.opts.host, m.opts.port);
  m.accept_thread = std::thread([impl = impl_] { impl->accept_loop(); });
}

void RouterServer::stop() {
  Impl& m = *impl_;
  if (!m.accept_thread.joinable()) return;
  m.stopping = true;
  beast::error_code ec;
  m.acceptor.cancel(ec);
  m.acceptor.close(ec);
  // A blocking accept() is not woken by close on every platform: connect once.
  {
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)), ec);
  }
  m.accept_thread.join();
  for (int i = 0; i < 200 && m.connections.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

std::string RouterServer::metrics_text() const { return impl_->metrics(); }

}  // namespace kvs::router
