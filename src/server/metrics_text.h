// Prometheus text exposition (format 0.0.4) of the engine loop's snapshot
// plus the HTTP layer's own counters, every name prefixed kvserve_. Labels
// carry status codes, reasons and classes only: never prompt text, never a
// tenant id in clear.
//
// Beside them, by default, the model-server protocol names that gateways and
// dashboards read from vLLM (vllm:num_requests_waiting, ...; see
// docs/SCALE-OUT.md), computed from the same snapshot.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "sched/engine_loop.h"

namespace kvs::server {

// Counters kept by the HTTP side (thread-safe).
class ServerCounters {
 public:
  void count_status(int http_status);            // every /v1/* completion request, by final status
  void count_reject(const std::string& reason);  // rejections decided by the server (auth, quota, ...)
  void stream_opened();
  void stream_closed();
  void client_disconnect();

  struct Snapshot {
    std::map<int, int64_t> status;
    std::map<std::string, int64_t> rejects;
    int64_t open_streams = 0, disconnects = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  Snapshot s_;
};

// Which extra metric families /metrics carries (--metrics-compat).
struct MetricsCompat {
  bool vllm = true;        // vllm:* names, labelled model_name and engine as vLLM does
  std::string model_name;  // the served model id (the model_name label)
};

// The whole /metrics body.
std::string render_metrics(const sched::MetricsSnapshot& m, const ServerCounters::Snapshot& c,
                           const MetricsCompat& compat = {});
// Only the vllm:* families (part of render_metrics when compat.vllm).
std::string render_vllm_metrics(const sched::MetricsSnapshot& m, const std::string& model_name);

}  // namespace kvs::server
