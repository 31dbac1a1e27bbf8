// The sockets: a Boost.Beast HTTP/1.1 server on an Asio io_context run by a
// few threads. Nothing is touched by two io threads at once: the listener
// (acceptor and its retry timer) has its own strand, and each connection is
// a session on its own strand (socket, timers, parser, its Exchange); the
// engine thread only posts wake-ups to a session's strand. A session reads one
// request (header and body under separate timeouts, a body limit and a
// header limit, so slow or huge requests cannot pin it), hands it to the
// ApiService, and writes the answer. While a completion runs, the session
// keeps a read pending to notice a client that hangs up (the request is then
// cancelled and its blocks freed at once) and writes SSE chunks as the
// engine's events arrive, never more than a bounded amount ahead.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/api_service.h"

namespace kvs::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (tests); see HttpServer::port()
  int threads = 4;                    // io_context threads
  size_t body_limit = 8u << 20;       // bytes; larger -> 413
  size_t header_limit = 64u << 10;    // bytes; larger -> 431
  double header_timeout_s = 30;       // idle keep-alive + request head
  double body_timeout_s = 60;         // request body
  double write_timeout_s = 60;        // one write may stall this long before the client is cut off
  size_t max_pending_bytes = 256u << 10;  // formatted SSE bytes waiting for the socket
};

class HttpServer {
 public:
  HttpServer(ApiService& api, HttpOptions opts);
  ~HttpServer();  // stop()

  // Binds and listens (throws std::runtime_error naming host:port on
  // failure), then starts the io threads.
  void start();
  int port() const { return port_; }
  // Closes the listening socket (on the listener's strand); existing
  // connections keep being served (new requests on them get 503 while the
  // ApiService is draining).
  void stop_accepting();
  // Connections with a request in progress.
  int active_requests() const;
  // Stops the io_context and joins its threads. Idempotent. Connections
  // still open are closed when the server is destroyed; the engine loop
  // must have been shut down (or its requests finished) by then, since a
  // session's request is cancelled on that loop.
  void stop();

  struct Impl;

 private:
  // Owns the io_context, so it outlives every session and handler.
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace kvs::server
