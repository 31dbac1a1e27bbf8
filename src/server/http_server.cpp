#include "server/http_server.h"

#include "kernels/thread_role.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>

#include "sched/clock.h"
#include "server/http_response.h"
#include "server/tcp_listen.h"

namespace kvs::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr std::string_view kServer = "kvserve";

}  // namespace

struct HttpServer::Impl {
  ApiService& api;
  HttpOptions opts;
  std::atomic<int> active{0};
  net::io_context ioc;
  // The listener's strand: the accept handler, the retry timer and the
  // close from stop_accepting() never run at the same time on two io threads.
  net::strand<net::io_context::executor_type> accept_strand;
  tcp::acceptor acceptor;
  net::steady_timer accept_retry;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard;

  Impl(ApiService& a, HttpOptions o)
      : api(a),
        opts(std::move(o)),
        ioc(std::max(1, opts.threads)),
        accept_strand(net::make_strand(ioc)),
        acceptor(accept_strand),
        accept_retry(accept_strand) {}
  // On the listener's strand (or before the io threads start).
  void do_accept();
  void on_accept(beast::error_code ec, tcp::socket s);
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `sock` was accepted onto its own strand; every handler below runs there.
  Session(tcp::socket sock, HttpServer::Impl& srv)
      : stream_(std::move(sock)), strand_(stream_.get_executor()), srv_(&srv), write_timer_(strand_) {}
  ~Session() { end_request(); }

  // Called on the listener's strand: the first read starts on the session's.
  void start() {
    net::dispatch(strand_, [self = shared_from_this()] { self->do_read(); });
  }

 private:
  beast::tcp_stream stream_;
  net::any_io_executor strand_;
  HttpServer::Impl* srv_;  // owns the io_context, so it outlives the session
  net::steady_timer write_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;

  std::shared_ptr<ResponseStream> ex_;  // a completion's Exchange or another stream
  bool in_request_ = false;
  bool keep_alive_ = true, chunked_ = true;
  std::string pending_, writing_;  // bytes to write next / in flight
  bool writing_now_ = false, response_done_ = false, closed_ = false;
  bool watch_pending_ = false, read_after_watch_ = false;

  // ---- reading a request ----
  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(srv_->opts.body_limit);
    parser_->header_limit(std::uint32_t(srv_->opts.header_limit));
    stream_.expires_after(sched::seconds_ms(srv_->opts.header_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return read_failed(ec);
    auto& req = parser_->get();
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      // curl sends larger bodies only after this.
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    stream_.expires_after(sched::seconds_ms(srv_->opts.body_timeout_s));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void read_failed(beast::error_code ec) {
    // Timeouts (slow or idle clients) and hang-ups just close; requests
    // that are too big or malformed get a short error first.
    if (ec == http::error::body_limit)
      return reply_and_close(413, "request_too_large", "the request body exceeds the limit");
    if (ec == http::error::header_limit)
      return reply_and_close(431, "headers_too_large", "the request headers exceed the limit");
    if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted)
      return close();
    return reply_and_close(400, "bad_request", "malformed HTTP request");
  }

  void reply_and_close(int status, const char* code, const char* msg) {
    ApiError e;
    e.status = status;
    e.code = code;
    e.message = msg;
    srv_->api.counters().count_status(status);
    keep_alive_ = false;
    stream_.expires_never();
    pending_ += full_response(error_response(e), kServer, false);
    response_done_ = true;
    flush();
  }

  void on_body(beast::error_code ec) {
    if (ec) return read_failed(ec);
    stream_.expires_never();
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    chunked_ = req.version() >= 11;
    HttpRequest hr;
    hr.method = std::string(req.method_string());
    hr.target = std::string(req.target());
    hr.authorization = std::string(req[http::field::authorization]);
    hr.body = std::move(req.body());
    parser_.reset();
    in_request_ = true;
    ++srv_->active;
    response_done_ = false;
    // Runs on the engine thread: it only posts. The session is looked up on
    // its strand, so the engine thread never holds (and never destroys) it.
    std::weak_ptr<Session> weak = weak_from_this();
    net::any_io_executor strand = strand_;
    auto wake = [weak, strand] {
      net::post(strand, [weak] {
        if (auto s = weak.lock()) s->pump();
      });
    };
    Routed r;
    try {
      r = srv_->api.handle(hr, wake);
    } catch (const std::exception& e) {
      // Never let one request's bug take the process down; log without content.
      std::fprintf(stderr, "kvserve: internal error handling %s %s: %s\n", hr.method.c_str(),
                   hr.target.substr(0, 64).c_str(), e.what());
      ApiError err;
      err.status = 500;
      err.type = "server_error";
      err.message = "internal error";
      r.response = error_response(err);
    }
    if (r.exchange || r.stream) {
      ex_ = r.exchange ? std::shared_ptr<ResponseStream>(std::move(r.exchange)) : std::move(r.stream);
      start_watch();
      pump();  // events may already be queued
      return;
    }
    if (srv_->api.draining()) keep_alive_ = false;
    pending_ += full_response(r.response, kServer, keep_alive_);
    // HEAD: the same head (Content-Length included), no body.
    if (hr.method == "HEAD") pending_.resize(pending_.size() - r.response.body.size());
    response_done_ = true;
    flush();
  }

  // ---- noticing a client that hangs up while its request runs ----
  void start_watch() {
    if (watch_pending_ || closed_) return;
    watch_pending_ = true;
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->on_watch(ec, n);
    });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watch_pending_ = false;
    if (!ec) buffer_.commit(n);  // a pipelined next request: kept for the parser
    if (read_after_watch_) {
      read_after_watch_ = false;
      return do_read();
    }
    if (closed_) return;
    if (ec && ec != net::error::operation_aborted) {
      if (ex_) ex_->client_gone();
      return close();
    }
    if (ex_ && buffer_.size() < 65536) start_watch();
  }

  // ---- writing ----
  void pump() {
    if (!ex_ || closed_) return;
    // Do not format further ahead of a slow socket: the engine-side queue
    // fills instead, and its overflow cuts the client off.
    if (writing_now_ && pending_.size() > srv_->opts.max_pending_bytes) return;
    StreamOutput out = ex_->poll();
    if (out.cut_off) {
      ex_->client_gone();
      return close();
    }
    if (out.full) {
      if (srv_->api.draining()) keep_alive_ = false;
      pending_ += full_response(*out.full, kServer, keep_alive_);
      response_done_ = true;
    } else {
      if (out.start_stream) {
        srv_->api.counters().stream_opened();
        streaming_ = true;
        // HTTP/1.0 clients get the stream until the connection closes.
        pending_ += stream_head(200, kServer, "text/event-stream", chunked_, chunked_);
        if (!chunked_) keep_alive_ = false;
      }
      if (!out.data.empty()) pending_ += chunked_ ? http_chunk(out.data) : out.data;
      if (out.done) {
        if (chunked_) pending_ += http_chunk("");
        response_done_ = true;
      }
    }
    flush();
  }
  bool streaming_ = false;

  void flush() {
    if (writing_now_ || closed_) return;
    if (pending_.empty()) {
      if (response_done_) finish_request();
      return;
    }
    writing_.swap(pending_);
    pending_.clear();
    writing_now_ = true;
    write_timer_.expires_after(sched::seconds_ms(srv_->opts.write_timeout_s));
    write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      // A client that does not read for this long is cut off.
      if (!ec && self->writing_now_) {
        if (self->ex_) self->ex_->client_gone();
        self->close();
      }
    });
    net::async_write(stream_, net::buffer(writing_),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_now_ = false;
    write_timer_.cancel();
    if (closed_) return;
    if (ec) {
      if (ex_) ex_->client_gone();
      return close();
    }
    if (ex_ && !response_done_) return pump();  // it may have held back
    flush();
  }

  void end_request() {
    if (streaming_) {
      srv_->api.counters().stream_closed();
      streaming_ = false;
    }
    ex_.reset();  // cancels a request still running, releases quota, logs
    if (in_request_) {
      in_request_ = false;
      --srv_->active;
    }
  }

  void finish_request() {
    end_request();
    response_done_ = false;
    if (!keep_alive_ || srv_->api.draining()) {
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      return close();
    }
    if (watch_pending_) {
      // The pending watch read must finish before the parser reads again.
      read_after_watch_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    do_read();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    write_timer_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    end_request();
  }
};

}  // namespace

void HttpServer::Impl::do_accept() {
  // The handler runs on the acceptor's executor, the listener's strand;
  // each new socket gets a strand of its own.
  acceptor.async_accept(net::make_strand(ioc),
                        [this](beast::error_code ec, tcp::socket s) { on_accept(ec, std::move(s)); });
}

void HttpServer::Impl::on_accept(beast::error_code ec, tcp::socket s) {
  if (!acceptor.is_open()) return;  // stop_accepting() closed it
  if (ec) {
    // Out of descriptors and the like: back off instead of spinning.
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([this](beast::error_code e) {
      if (!e && acceptor.is_open()) do_accept();
    });
    return;
  }
  std::make_shared<Session>(std::move(s), *this)->start();
  do_accept();
}

HttpServer::HttpServer(ApiService& api, HttpOptions opts) : impl_(std::make_unique<Impl>(api, std::move(opts))) {}

HttpServer::~HttpServer() { stop(); }

int HttpServer::active_requests() const { return impl_->active.load(); }

void HttpServer::start() {
  Impl& m = *impl_;
  port_ = server::listen_on(m.acceptor, m.opts.host, m.opts.port);
  m.guard.emplace(net::make_work_guard(m.ioc));
  m.do_accept();
  for (int i = 0; i < std::max(1, m.opts.threads); ++i)
    threads_.emplace_back([impl = impl_.get()] {
      mark_latency_thread();  // answers must not wait for a compute slice
      for (;;) {
        try {
          impl->ioc.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "kvserve: http thread: %s\n", e.what());
        }
      }
    });
}

void HttpServer::stop_accepting() {
  net::post(impl_->accept_strand, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->accept_retry.cancel();
  });
}

void HttpServer::stop() {
  if (threads_.empty()) return;
  impl_->guard.reset();
  impl_->ioc.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace kvs::server
