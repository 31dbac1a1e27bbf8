// Prometheus text of the KV tiers (appended to /metrics):
//   kvserve_kv_tier_{hits,misses,stores,evictions,errors}_total{tier}
//   kvserve_kv_tier_bytes{tier}, kvserve_kv_tier_available{tier}
//   kvserve_kv_tier_dropped_writes_total, kvserve_kv_tier_queue_bytes,
//   kvserve_kv_tier_staged_bytes
#pragma once
#include <string>

#include "tiers/tier_set.h"

namespace kvs::tiers {
std::string metrics_text(const TierSetStats& s);
}
