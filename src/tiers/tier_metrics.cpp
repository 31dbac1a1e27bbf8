#include "tiers/tier_metrics.h"

namespace kvs::tiers {

std::string metrics_text(const TierSetStats& s) {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const TierCounters& t : s.tiers)
      out += std::string(name) + "{tier=\"" + t.tier + "\"} " + std::to_string(value(t)) + "\n";
  };
  family("kvserve_kv_tier_hits_total", "counter", "Blocks loaded from the tier instead of recomputed",
         [](const TierCounters& t) { return t.hits; });
  family("kvserve_kv_tier_misses_total", "counter", "Block lookups the tier could not answer",
         [](const TierCounters& t) { return t.misses; });
  family("kvserve_kv_tier_stores_total", "counter", "Blocks written to the tier",
         [](const TierCounters& t) { return t.stores; });
  family("kvserve_kv_tier_evictions_total", "counter", "Entries the tier dropped for capacity",
         [](const TierCounters& t) { return t.evictions; });
  family("kvserve_kv_tier_errors_total", "counter",
         "Failed reads and writes, and entries rejected as tampered, truncated, foreign or undecryptable",
         [](const TierCounters& t) { return t.errors; });
  family("kvserve_kv_tier_bytes", "gauge",
         "Bytes the tier holds: disk, its entry files; redis, the server's used_memory (all its keys, every "
         "replica's entries), read every few seconds", [](const TierCounters& t) { return t.bytes; });
  family("kvserve_kv_tier_available", "gauge", "1 when the tier's medium answers",
         [](const TierCounters& t) { return int64_t(t.available); });
  out += "# HELP kvserve_kv_tier_dropped_writes_total Blocks not written behind because the queue was full\n"
         "# TYPE kvserve_kv_tier_dropped_writes_total counter\nkvserve_kv_tier_dropped_writes_total " +
         std::to_string(s.dropped_writes) + "\n";
  out += "# HELP kvserve_kv_tier_queue_bytes Block bytes waiting to be written behind\n"
         "# TYPE kvserve_kv_tier_queue_bytes gauge\nkvserve_kv_tier_queue_bytes " + std::to_string(s.queue_bytes) + "\n";
  out += "# HELP kvserve_kv_tier_staged_bytes Fetched block bytes waiting for their request's admission\n"
         "# TYPE kvserve_kv_tier_staged_bytes gauge\nkvserve_kv_tier_staged_bytes " + std::to_string(s.staged_bytes) + "\n";
  return out;
}

}  // namespace kvs::tiers
