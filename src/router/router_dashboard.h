// What GET /dashboard/events sends for `kvserve router`: one row per worker
// (up or down and why, load, requests in flight from the router, and the KV
// block counts and queue of its last /metrics) plus the last ten minutes of
// the workers' free blocks and queue depth summed. The page is the one
// `kvserve serve` serves (server/dashboard_page.h); it draws this shape when
// "mode" is "router". Worker URLs and counts only: no tenant, no text.
#pragma once
#include <deque>
#include <string>

#include "router/workers.h"

namespace kvs::router {

class RouterDashboard {
 public:
  explicit RouterDashboard(const WorkerSet& workers, size_t history = 600) : workers_(workers), keep_(history) {}
  // One snapshot as JSON text; records a history sample. One caller at a time.
  std::string sample(double now);

 private:
  struct Point {
    double t = 0, available = 0, queued = 0, running = 0;
  };
  const WorkerSet& workers_;
  size_t keep_;
  std::deque<Point> history_;
};

}  // namespace kvs::router
