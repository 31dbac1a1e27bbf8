// Internal to src/router: RouterServer's state and the pieces its source
// files share (router_server.cpp: connections, proxying, metrics;
// router_routes.cpp: the routes beyond completions). Not for other modules.
#pragma once
#include <utility>  // std::exchange, used by Boost.Asio 1.74 headers under C++20
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "router/router_dashboard.h"
#include "router/router_server.h"
#include "sched/clock.h"
#include "server/dashboard_hub.h"
#include "server/http_response.h"
#include "server/openai_codec.h"

namespace kvs::router {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

inline constexpr std::string_view kServer = "kvserve-router";

// retry_after / allow: the Retry-After and Allow headers (a 429 / 503, a 405).
inline std::string respond(int status, const std::string& type, const std::string& body, bool keep_alive,
                           const std::string& retry_after = "", const std::string& allow = "") {
  server::HttpResponse r{status, type, body, {}};
  if (!retry_after.empty()) r.headers.emplace_back("Retry-After", retry_after);
  if (!allow.empty()) r.headers.emplace_back("Allow", allow);
  return server::full_response(r, kServer, keep_alive);
}

inline std::string error_json(const std::string& type, const std::string& code, const std::string& msg) {
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

// The worker's side of one relayed request.
struct Upstream {
  int w;
  uint64_t downs;  // the worker's down count when the request went out
  beast::tcp_stream up;
  beast::flat_buffer buf;
  http::response_parser<http::buffer_body> p;
  bool marked_down = false;  // a body read ended: the worker was marked down and went silent
  Upstream(net::io_context& ioc, int worker, uint64_t d) : w(worker), downs(d), up(ioc) {}
};

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
  // completion: hashed and placed by the policy; otherwise the least
  // loaded up worker takes it.
  bool proxy(Conn& client, const http::request<http::string_body>& req, bool keep_alive, bool completion);
  // The worker routes beyond completions and /v1/models (router_routes.cpp):
  // whether the connection stays open, or nullopt when `path` is none of them.
  std::optional<bool> other_route(Conn& client, const http::request<http::string_body>& req, const std::string& path,
                                  bool keep_alive);
  // GET/DELETE /v1/responses/{id}: the first up worker that knows the id answers.
  bool stored_response(Conn& client, const http::request<http::string_body>& req, bool keep_alive);
  // POST /v1/responses: to the worker that stored previous_response_id, if any.
  bool responses(Conn& client, const http::request<http::string_body>& req, bool keep_alive);
  // The up worker that stored response `id` for the caller of `req`; -1: none.
  int holder_of(const std::string& id, const http::request<http::string_body>& req, Conn& client);
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
  // One forwarding attempt to worker w, counted and logged (one access-log
  // line: `role` names a P/D leg, "" otherwise).
  Relay leg(int w, const http::request<http::string_body>& in, Conn& client, bool keep_alive, bool forward = true,
            const char* role = "");
  void log_leg(int w, const http::request<http::string_body>& in, const Relay& r, double seconds, const char* role) const;
  bool proxy_pd(Conn& client, const http::request<http::string_body>& req, bool keep_alive);
  // Connects to worker w and sends the request; false (r.failover set) on failure.
  bool send_upstream(int w, const http::request<http::string_body>& in, Conn& c, beast::tcp_stream& up, Relay& r);
  void stream_body(Conn& client, Upstream& u, bool keep_alive, Relay& r);
  void end_stream_on_error(Conn& client, Upstream& u, const beast::error_code& ec, Relay& r);
  // The next piece of a relayed body into tmp (at most n bytes, under the
  // read deadline): whatever the worker has sent so far, not a full buffer,
  // so each SSE event goes on as it comes. How many bytes came; `ec` is set
  // when the read failed, and u.marked_down too when it ended because the
  // worker was marked down and stayed silent (relay.cpp).
  size_t read_piece(Conn& client, Upstream& u, char* tmp, size_t n, beast::error_code& ec);
  std::string down_reason(int w) const;
  // The Retry-After of a 503 no_worker: the next health check may bring a
  // worker back.
  std::string no_worker_retry_after() const {
    return std::to_string(std::max<int64_t>(1, int64_t(std::ceil(opts.health_interval_s))));
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

}  // namespace kvs::router
