#include "router/policy.h"

#include <charconv>

namespace kvs::router {

std::optional<Policy> parse_policy(const std::string& s) {
  if (s == "cache") return Policy::Cache;
  if (s == "round-robin") return Policy::RoundRobin;
  if (s == "least-load") return Policy::LeastLoad;
  return std::nullopt;
}

const char* to_string(Policy p) {
  switch (p) {
    case Policy::Cache: return "cache";
    case Policy::RoundRobin: return "round-robin";
    case Policy::LeastLoad: return "least-load";
  }
  return "?";
}

int choose(Policy p, const std::vector<Candidate>& c, int prompt_blocks, double load_weight, uint64_t turn,
           const std::vector<bool>& excluded) {
  const size_t n = c.size();
  int best = -1;
  double best_cost = 0, best_load = 0;
  // Visiting from a rotating start makes "first of equals" a round robin.
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (size_t(turn) + k) % n;
    if (!c[i].up || (i < excluded.size() && excluded[i])) continue;
    if (p == Policy::RoundRobin) return int(i);
    double cost = c[i].load;
    if (p == Policy::Cache)
      cost = double(prompt_blocks - c[i].hits) + load_weight * double(prompt_blocks) * c[i].load;
    if (best < 0 || cost < best_cost || (cost == best_cost && c[i].load < best_load)) {
      best = int(i);
      best_cost = cost;
      best_load = c[i].load;
    }
  }
  return best;
}

namespace {

// Retry-After as delta-seconds; nullopt when it is not a plain number.
std::optional<int64_t> delta_seconds(const std::string& v) {
  int64_t s = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), s);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || s < 0) return std::nullopt;
  return s;
}

}  // namespace

bool sooner_retry(const std::string& a, const std::string& b) {
  const auto da = delta_seconds(a), db = delta_seconds(b);
  return da && (!db || *da < *db);
}

}  // namespace kvs::router
