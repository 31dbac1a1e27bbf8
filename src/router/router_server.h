// `kvserve router`'s HTTP side: an OpenAI-compatible front on its own port
// that sends each completion request to one worker and relays the answer
// unchanged (SSE streams chunk by chunk), with the client's own
// Authorization header, so workers still authenticate and derive scopes.
//
// Per request: the prompt's block hashes (RequestHasher) are looked up in
// the prefix index, the policy picks a worker (router/policy.h), and the
// request is forwarded. Failover:
//   - a worker that refuses, resets or closes before the first response
//     byte is marked down and the request goes to another worker, at most
//     once more; a 429 from one worker is also tried once elsewhere; so is
//     a request still awaiting its answer's head when the health checker
//     marks its worker down (a frozen worker never answers);
//   - a stream cut after its first byte ends with an error event (type
//     server_error, code worker_failed) and data: [DONE], never silently,
//     and never replayed elsewhere (the client has tokens); so does one
//     whose worker is marked down and stays silent for the health check's
//     timeout (a non-streamed answer in progress: 502 worker_failed);
//   - with no worker up: 503 naming each worker's reason; when every worker
//     tried answered 429, the 429 with the soonest Retry-After, counted
//     (kvserve_router_saturated_total).
// A client that leaves mid-stream closes the worker connection, which
// cancels the request there (its blocks are freed).
//
// Connections are served one thread each (bounded by max_connections; over
// it a connection gets 503 at once).
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "router/event_listener.h"
#include "router/policy.h"
#include "router/prefix_index.h"
#include "router/request_hasher.h"
#include "router/workers.h"

namespace kvs::router {

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port
  Policy policy = Policy::Cache;
  double load_weight = 0.2;        // router/policy.h
  size_t body_limit = 8u << 20;
  size_t header_limit = 64u << 10;  // as a worker's (server/http_server.h); larger -> 431
  double connect_timeout_s = 2;
  double read_timeout_s = 600;     // a worker silent this long is treated as failed
  double client_timeout_s = 60;    // request head and body from the client
  double health_interval_s = 1;    // a 503 no_worker's Retry-After: a worker can be back after one check
  int max_connections = 512;
  // Disaggregated serving (docs/DISAGG.md): completions go to a prefill
  // worker and a decode worker chosen per request (router/pd_choice.h);
  // indices into the WorkerSet.
  std::vector<int> prefill_workers, decode_workers;
};

class RouterServer {
 public:
  RouterServer(WorkerSet& workers, PrefixIndex& index, EventListener& events, const RequestHasher& hasher,
               RouterOptions opts);
  ~RouterServer();  // stop()

  // Binds (throws std::runtime_error naming host:port) and starts accepting.
  void start();
  int port() const { return port_; }
  // Stops accepting and waits (bounded) for open connections to end.
  void stop();

  std::string metrics_text() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace kvs::router
