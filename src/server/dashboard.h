// What GET /dashboard/events sends once per second for `kvserve serve`: one
// JSON object built from the engine loop's PoolView (the pool cell by cell
// and the metrics of the same instant, the state /metrics renders), the last
// ten minutes of free blocks and queue depth, admissions and rejections with
// their worst-case block estimates, prefix hit rate, latency per SLO class
// and per-tenant usage against quota. Tenants appear only as hashes and no
// prompt or completion text is ever part of it.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "kv/pool_snapshot.h"
#include "sched/engine_loop.h"
#include "server/metrics_text.h"
#include "server/tenants.h"

namespace kvs::server {

struct DashboardOptions {
  int32_t max_cells = 4096;     // above this many blocks, cells aggregate blocks
  double view_timeout_s = 0.5;  // longest wait for the engine thread's view
  size_t history = 600;         // samples kept (one per snapshot)
  std::string model_id;
  std::vector<std::string> plots;  // SVG file names served under /dashboard/plots/
  // KV tiers below RAM (disk, Redis), when configured: a JSON array text of
  // {tier, hits, misses, stores, evictions, errors, bytes, available}.
  std::function<std::string()> tiers_json;
  // On-device mode (--device-monitor): a JSON object text of
  // {level, causes, state, transitions}.
  std::function<std::string()> device_json;
};

// The "pool" member: counts and one entry per cell in parallel arrays
// (f, c, u: free / cached / used blocks; s: shared; r: highest ref count;
// o: index into "owners", the tenants' hashes, -1 for none).
std::string pool_json(const PoolCells& c, const std::vector<std::string>& owner_tenants, int block_size);

class ServeDashboard {
 public:
  // `tenants` and `counters` may be null; all must outlive this.
  ServeDashboard(sched::EngineLoop& loop, const TenantRegistry* tenants, const ServerCounters* counters,
                 DashboardOptions opts);
  // One snapshot as JSON text; records a history sample. One caller at a time.
  std::string sample();
  const DashboardOptions& options() const { return opts_; }

 private:
  struct Point {
    double t = 0;
    int64_t free = 0, available = 0, queued = 0, promised = 0, running = 0;
  };
  sched::EngineLoop& loop_;
  const TenantRegistry* tenants_;
  const ServerCounters* counters_;
  DashboardOptions opts_;
  std::deque<Point> history_;
};

}  // namespace kvs::server
