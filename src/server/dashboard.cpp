#include "server/dashboard.h"

#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

namespace kvs::server {

using nlohmann::json;

namespace {

void append_ints(std::string& out, const char* name, const std::vector<int32_t>& v) {
  out += '"';
  out += name;
  out += "\":[";
  char buf[16];
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    const auto r = std::to_chars(buf, buf + sizeof buf, v[i]);
    out.append(buf, r.ptr);
  }
  out += ']';
}

json latency_json(const sched::MetricsSnapshot& m) {
  json j = json::object();
  for (int k = 0; k < sched::kNumSloClasses; ++k) {
    const sched::Histogram& tt = m.ttft_by_class[size_t(k)];
    const sched::Histogram& tp = m.tpot_by_class[size_t(k)];
    j[sched::to_string(sched::SloClass(k))] = {
        {"requests", tt.count},     {"ttft_p50", tt.quantile(0.5)}, {"ttft_p99", tt.quantile(0.99)},
        {"choices", tp.count},      {"tpot_p50", tp.quantile(0.5)}, {"tpot_p99", tp.quantile(0.99)}};
  }
  return j;
}

json admission_json(const sched::MetricsSnapshot& m, const ServerCounters* counters, double now) {
  json rej = json::object();
  int64_t rejected = 0;
  for (int r = 1; r < sched::kNumRejectReasons; ++r) {
    rej[sched::to_string(sched::RejectReason(r))] = m.rejections[size_t(r)];
    rejected += m.rejections[size_t(r)];
  }
  json server = json::object();
  if (counters)
    for (const auto& [reason, n] : counters->snapshot().rejects) server[reason] = n;
  json recent = json::array();
  for (const sched::RejectRecord& r : m.recent_rejects)
    recent.push_back({{"age_s", std::max(0.0, now - r.t)},
                      {"reason", sched::to_string(r.reason)},
                      {"class", sched::to_string(r.slo)},
                      {"tenant", r.tenant},
                      {"need_blocks", r.need_blocks}});
  return {{"submitted", m.requests_submitted}, {"admitted", m.requests_submitted - rejected},
          {"finished", m.requests_finished},   {"cancelled", m.requests_cancelled},
          {"failed", m.requests_failed},       {"rejected", rejected},
          {"by_reason", rej},                  {"server_rejects", server},
          {"recent", recent},                  {"prefix_waits", m.prefix_waits}};
}

// One row per tenant hash: its requests' worst case against the engine's
// per-tenant cap, the key file's quota, and the blocks it holds in the pool.
json tenants_json(const sched::PoolView* v, const sched::MetricsSnapshot& m, const TenantRegistry* reg) {
  struct Row {
    int64_t footprint = 0, used = 0, cached = 0, key_quota = 0, key_reserved = 0;
  };
  std::map<std::string, Row> rows;
  for (const auto& [t, b] : m.tenant_blocks) rows[t].footprint = b;
  if (v)
    for (size_t i = 0; i < v->cells.owners.size(); ++i) {
      Row& r = rows[v->owner_tenants[i].empty() ? "?" : v->owner_tenants[i]];
      r.used += v->cells.owner_used[i];
      r.cached += v->cells.owner_cached[i];
    }
  if (reg)
    for (const TenantUsage& u : reg->usage()) {
      Row& r = rows[u.hash];
      r.key_quota = u.quota_blocks;
      r.key_reserved = u.reserved_blocks;
    }
  const bool capped = m.tenant_quota_blocks < m.kv_blocks_total;
  json out = json::array();
  for (const auto& [t, r] : rows)
    out.push_back({{"tenant", t},
                   {"footprint_blocks", r.footprint},
                   {"quota_blocks", capped ? json(m.tenant_quota_blocks) : json(nullptr)},
                   {"used_blocks", r.used},
                   {"cached_blocks", r.cached},
                   {"key_quota_blocks", r.key_quota},
                   {"key_reserved_blocks", r.key_reserved}});
  return out;
}

}  // namespace

std::string pool_json(const PoolCells& c, const std::vector<std::string>& owner_tenants, int block_size) {
  std::string out;
  out.reserve(size_t(c.cells()) * 16 + 256);
  out += "{\"total\":" + std::to_string(c.total) + ",\"free\":" + std::to_string(c.free) +
         ",\"cached\":" + std::to_string(c.cached) + ",\"used\":" + std::to_string(c.used) +
         ",\"group\":" + std::to_string(c.group) + ",\"block_size\":" + std::to_string(block_size) + ",";
  append_ints(out, "f", c.n_free);
  out += ',';
  append_ints(out, "c", c.n_cached);
  out += ',';
  append_ints(out, "u", c.n_used);
  out += ',';
  append_ints(out, "s", c.n_shared);
  out += ',';
  append_ints(out, "r", c.max_ref);
  out += ',';
  append_ints(out, "o", c.owner);
  if (c.n_tables > 1) {  // the hybrid cache: which KV table each cell serves
    out += ",\"tables\":" + std::to_string(c.n_tables) + ',';
    append_ints(out, "t", c.table);
    out += ',';
    append_ints(out, "table_used", c.table_used);
  }
  out += ",\"owners\":" + json(owner_tenants).dump() + "}";
  return out;
}

ServeDashboard::ServeDashboard(sched::EngineLoop& loop, const TenantRegistry* tenants, const ServerCounters* counters,
                               DashboardOptions opts)
    : loop_(loop), tenants_(tenants), counters_(counters), opts_(std::move(opts)) {}

std::string ServeDashboard::sample() {
  const std::shared_ptr<const sched::PoolView> v = loop_.pool_view(opts_.max_cells, opts_.view_timeout_s);
  // Without a view yet (the engine thread is busy with its first step) the
  // counters still go out, without the map.
  const sched::MetricsSnapshot m = v ? v->metrics : loop_.metrics();
  const double now = v ? v->t : 0;
  Point p;
  p.t = now;
  p.free = m.kv_blocks_free;
  p.available = m.kv_blocks_free + m.kv_blocks_cached;
  p.queued = v ? v->queued_peak : m.queued[0] + m.queued[1];
  p.promised = m.kv_blocks_promised;
  p.running = m.running_requests;
  history_.push_back(p);
  while (history_.size() > opts_.history) history_.pop_front();

  json hist = {{"headroom", m.kv_headroom_blocks}, {"total", m.kv_blocks_total}};
  for (const char* k : {"age_s", "free", "available", "queued", "promised", "running"}) hist[k] = json::array();
  for (const Point& q : history_) {
    hist["age_s"].push_back(std::round((now - q.t) * 10) / 10);
    hist["free"].push_back(q.free);
    hist["available"].push_back(q.available);
    hist["queued"].push_back(q.queued);
    hist["promised"].push_back(q.promised);
    hist["running"].push_back(q.running);
  }
  const double hit_rate =
      m.prefix_query_tokens > 0 ? double(m.prefix_hit_tokens) / double(m.prefix_query_tokens) : 0.0;
  json j = {{"mode", "serve"},
            {"model", opts_.model_id},
            {"blocks", {{"total", m.kv_blocks_total}, {"free", m.kv_blocks_free}, {"cached", m.kv_blocks_cached},
                        {"used", m.kv_blocks_used}, {"promised", m.kv_blocks_promised},
                        {"headroom", m.kv_headroom_blocks}, {"block_size", m.block_size}}},
            {"history", hist},
            {"admission", admission_json(m, counters_, now)},
            {"prefix", {{"query_tokens", m.prefix_query_tokens}, {"hit_tokens", m.prefix_hit_tokens},
                        {"hit_rate", hit_rate}}},
            {"latency", latency_json(m)},
            {"running", {{"requests", m.running_requests}, {"seqs", m.running_seqs},
                         {"waiting_interactive", m.queued[0]}, {"waiting_batch", m.queued[1]}}},
            {"preemptions", m.preemptions},
            {"tenants", tenants_json(v.get(), m, tenants_)},
            {"plots", opts_.plots}};
  if (opts_.tiers_json) j["tiers"] = json::parse(opts_.tiers_json());
  if (opts_.device_json) j["device"] = json::parse(opts_.device_json());
  std::string s = j.dump();
  if (v) {
    // The map is spliced in as text: it is most of the bytes and needs no
    // JSON tree.
    s.pop_back();
    s += ",\"pool\":" + pool_json(v->cells, v->owner_tenants, m.block_size) + "}";
  }
  return s;
}

}  // namespace kvs::server
