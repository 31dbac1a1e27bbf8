// One forwarding attempt: the request to a worker, its answer back to the
// client (held, or relayed as it comes), with the watches that end a wait
// on a worker that will never answer: a client that hangs up, and a worker
// the health checker marks down (a frozen worker, SIGSTOP or a swap storm,
// keeps its sockets open and would hold the request for --read-timeout).
#include <cctype>
#include <limits>

#include "router/relay_watch.h"
#include "router/router_impl.h"
#include "server/sse_stream.h"

namespace kvs::router {

namespace {

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

// Until `ended`: a client that hangs up (end of stream or an error) sets
// `left` and closes `up`.
void watch_client(Conn& client, beast::tcp_stream& up, bool& left, const bool& ended) {
  watch_hangup(client.stream.socket(), ended, [&up, &left] {
    left = true;
    beast::error_code ignored;
    up.socket().close(ignored);
  });
}

// Until `ended`: every 100 ms, whether worker w went down since the
// request went out (`downs`: its count then) while this read has waited at
// least `quiet_s` (since `t0`); if so `marked` is set and `up` closed, which
// ends the read. Before the answer's head quiet_s is 0: nothing reached the
// client, so the request fails over at once. Within a body it is the health
// check's own timeout: a worker still sending is alive whatever one check
// said, and one silent that long is as dead as its /health.
void watch_worker(const WorkerSet& workers, int w, uint64_t downs, double quiet_s, net::steady_timer& t,
                  beast::tcp_stream& up, bool& marked, const bool& ended) {
  const double t0 = sched::steady_now();
  poll_every(t, std::chrono::milliseconds(100), ended, [&workers, w, downs, t0, quiet_s, &up, &marked] {
    if (workers.downs(w) == downs || sched::steady_now() - t0 < quiet_s) return false;
    marked = true;
    beast::error_code ignored;
    up.socket().close(ignored);
    return true;
  });
}

}  // namespace

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

size_t RouterServer::Impl::read_piece(Conn& client, Upstream& u, char* tmp, size_t n, beast::error_code& ec) {
  u.p.get().body().data = tmp;
  u.p.get().body().size = n;
  u.up.expires_after(sched::seconds_ms(opts.read_timeout_s));
  net::steady_timer poll(client.ioc);
  bool ended = false;
  watch_worker(workers, u.w, u.downs, kHealthTimeoutS, poll, u.up, u.marked_down, ended);
  ec = await(client.ioc, [&](auto h) {
    http::async_read_some(u.up, u.buf, u.p, [&poll, &ended, h](beast::error_code e, size_t k) mutable {
      ended = true;  // ends the watch
      poll.cancel();
      h(e, k);
    });
  });
  if (ec == http::error::need_buffer) ec = {};
  return n - u.p.get().body().size;
}

std::string RouterServer::Impl::down_reason(int w) const { return workers.snapshot()[size_t(w)].down_reason; }

Relay RouterServer::Impl::relay(int w, const http::request<http::string_body>& in, Conn& client, bool keep_alive,
                                bool forward) {
  Relay r;
  Upstream u(client.ioc, w, workers.downs(w));
  if (!send_upstream(w, in, client, u.up, r)) return r;
  // No limit on a relayed answer; an explicit maximum rather than none,
  // which Boost 1.74 compares wrongly with a Content-Length.
  u.p.body_limit(std::numeric_limits<std::uint64_t>::max());
  // The worker may not answer for long (a prefill leg answers after the
  // whole prompt). A client that hangs up meanwhile closes the worker's
  // connection, so the worker cancels the request too.
  bool client_left = false, marked_down = false, ended = false;
  watch_client(client, u.up, client_left, ended);
  net::steady_timer poll(client.ioc);
  watch_worker(workers, w, u.downs, 0, poll, u.up, marked_down, ended);
  beast::error_code ec = await(client.ioc, [&](auto h) {
    http::async_read_header(u.up, u.buf, u.p, [&client, &poll, &ended, h](beast::error_code e, size_t n) mutable {
      ended = true;  // ends the watches
      beast::error_code ignored;
      client.stream.socket().cancel(ignored);
      poll.cancel();
      h(e, n);
    });
  });
  if (client_left) {
    r.client_gone = true;
    return r;
  }
  if (marked_down || ec) {
    // Nothing reached the client: another worker can take it.
    r.failover = true;
    r.error = marked_down ? "marked down before answering: " + down_reason(w) : "before the first byte: " + ec.message();
    return r;
  }
  r.status = int(u.p.get().result_int());
  r.content_type = std::string(u.p.get()[http::field::content_type]);
  r.retry_after = std::string(u.p.get()[http::field::retry_after]);
  if (forward && r.content_type.rfind("text/event-stream", 0) == 0) {
    stream_body(client, u, keep_alive, r);
    return r;
  }
  char tmp[16384];
  while (!ec && !u.p.is_done()) r.body.append(tmp, read_piece(client, u, tmp, sizeof tmp, ec));
  if (ec) {
    // A plain answer cut short: nothing was sent yet, so it is a clear 502.
    r.status = 502;
    r.body = error_json("server_error", "worker_failed",
                        u.marked_down ? "the worker was marked down (" + down_reason(w) +
                                            ") while sending this answer, and went silent: nothing of it was "
                                            "used; retry the request"
                                      : "the worker's response was cut short (" + ec.message() + ")");
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

void RouterServer::Impl::stream_body(Conn& client, Upstream& u, bool keep_alive, Relay& r) {
  r.sent = true;
  count_routed(u.w, r);
  if (!write(client, server::stream_head(r.status, kServer, r.content_type, true, keep_alive))) {
    r.client_gone = true;
    return;
  }
  std::string tail;  // the last bytes seen, for the usage's cached_tokens
  char tmp[16384];
  beast::error_code ec;
  while (!ec && !u.p.is_done()) {
    const size_t got = read_piece(client, u, tmp, sizeof tmp, ec);
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
  if (ec) end_stream_on_error(client, u, ec, r);
  if (!r.client_gone && !write(client, server::http_chunk(""))) r.client_gone = true;
}

// The stream started: the client gets an error event and [DONE], never a
// silent cut, and never a replay elsewhere (it has tokens already).
void RouterServer::Impl::end_stream_on_error(Conn& client, Upstream& u, const beast::error_code& ec, Relay& r) {
  const std::string why =
      u.marked_down ? "the worker serving this stream was marked down (" + down_reason(u.w) +
                          ") and sent nothing since; the text so far stands, retry the request for the rest"
                    : "the worker serving this stream failed (" + ec.message() + ")";
  r.error = "mid-stream: " + (u.marked_down ? "marked down and silent" : ec.message());
  {
    std::lock_guard lk(mu);
    ++midstream_errors;
  }
  const std::string err = "data: " + error_json("server_error", "worker_failed", why) + "\n\ndata: [DONE]\n\n";
  // A worker marked down keeps the health checker's reason.
  if (!u.marked_down) workers.mark_down(u.w, r.error);
  events.reset(u.w);
  if (!write(client, server::http_chunk(err))) r.client_gone = true;
}

}  // namespace kvs::router
