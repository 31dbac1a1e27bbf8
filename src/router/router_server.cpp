#include "router/router_impl.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "router/pd_choice.h"
#include "server/dashboard_page.h"
#include "server/sse_stream.h"
#include "server/tcp_listen.h"

namespace kvs::router {

namespace {

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
    return proxy(client, req, keep, true);
  }
  if (path == "/v1/models" || path == "/models") return proxy(client, req, keep, false);
  if (const std::optional<bool> done = other_route(client, req, path, keep)) return *done;
  if (path == "/dashboard" && req.method() == http::verb::get)
    return write(client, respond(200, "text/html; charset=utf-8", server::dashboard_html(), keep));
  if (path == "/dashboard/snapshot" && req.method() == http::verb::get)
    return write(client, respond(200, "application/json", hub.latest(), keep));
  if (path == "/dashboard/events" && req.method() == http::verb::get) return dashboard_events(client);
  return write(client, respond(404, "application/json",
                               error_json("not_found_error", "not_found",
                                          "no route for " + std::string(req.method_string()) + " " + path),
                               keep));
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

bool RouterServer::Impl::proxy(Conn& client, const http::request<http::string_body>& req, bool keep_alive,
                               bool completion) {
  const std::string target(req.target());
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
                               keep_alive, no_worker_retry_after()));
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
                                   keep_alive, no_worker_retry_after()));
    }
    Relay pre = leg(pick->prefill, with_query(req, "kv_decode_peer=" + pick->decode_kv), client, keep_alive, false,
                    "prefill");
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
    Relay r = leg(pick->decode, with_query(req, handover), client, keep_alive, true, "decode");
    if (r.failover) return write(client, leg_failed("decode", r, keep_alive));
    if (r.client_gone) return false;
    if (!r.sent) return write(client, respond(r.status, r.content_type, r.body, keep_alive, r.retry_after));
    return keep_alive && r.status != 0;
  }
  return write(client, respond(last->status, last->content_type, last->body, keep_alive, last->retry_after));
}

Relay RouterServer::Impl::leg(int w, const http::request<http::string_body>& in, Conn& client, bool keep_alive,
                              bool forward, const char* role) {
  const double t0 = sched::steady_now();
  workers.begin_request(w);
  Relay r = relay(w, in, client, keep_alive, forward);
  workers.end_request(w);
  count_routed(w, r);
  if (r.failover) workers.mark_down(w, r.error);
  log_leg(w, in, r, sched::steady_now() - t0, role);
  return r;
}

// The router's access log: method and path (no query: a hand-over's handle
// is in it), the worker, its status and time; never a prompt or an answer.
void RouterServer::Impl::log_leg(int w, const http::request<http::string_body>& in, const Relay& r, double seconds,
                                 const char* role) const {
  const std::string target(in.target());
  std::string line = "kvserve router: request " + std::string(in.method_string()) + " " +
                     target.substr(0, target.find('?')) + (*role ? std::string(" leg=") + role : std::string()) +
                     " worker=" + workers.spec(w).url + " status=" + std::to_string(r.failover ? 0 : r.status);
  char ms[32];
  std::snprintf(ms, sizeof ms, " ms=%.1f", seconds * 1e3);
  line += ms;
  if (r.failover) line += " failed=\"" + r.error + "\"";
  if (r.client_gone) line += " client_gone";
  std::fprintf(stderr, "%s\n", line.c_str());
}

// Counted before the client gets the first byte of the answer, so a client
// that reads /metrics after its response finds it counted.
void RouterServer::Impl::count_routed(int w, Relay& r) {
  if (r.counted) return;
  r.counted = true;
  std::lock_guard lk(mu);
  ++routed[{w, r.failover ? 0 : r.status}];
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
