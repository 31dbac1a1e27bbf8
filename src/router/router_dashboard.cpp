#include "router/router_dashboard.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace kvs::router {

std::string RouterDashboard::sample(double now) {
  using nlohmann::json;
  const std::vector<WorkerView> v = workers_.snapshot();
  json rows = json::array();
  Point p;
  p.t = now;
  for (int i = 0; i < int(v.size()); ++i) {
    const WorkerView& w = v[size_t(i)];
    rows.push_back({{"url", workers_.spec(i).url}, {"up", w.up}, {"down_reason", w.down_reason},
                    {"load", w.load}, {"inflight", w.inflight}, {"waiting", w.waiting}, {"running", w.running},
                    {"kv_total", w.kv_total}, {"kv_free", w.kv_free}, {"kv_used", w.kv_used},
                    {"kv_cached", w.kv_cached}});
    if (!w.up) continue;
    p.available += w.kv_free + w.kv_cached;
    p.queued += w.waiting;
    p.running += w.running;
  }
  history_.push_back(p);
  while (history_.size() > keep_) history_.pop_front();
  json hist = {{"age_s", json::array()}, {"available", json::array()}, {"queued", json::array()}, {"running", json::array()}};
  for (const Point& q : history_) {
    hist["age_s"].push_back(std::round((now - q.t) * 10) / 10);
    hist["available"].push_back(q.available);
    hist["queued"].push_back(q.queued);
    hist["running"].push_back(q.running);
  }
  return json({{"mode", "router"}, {"workers", rows}, {"history", hist}}).dump();
}

}  // namespace kvs::router
