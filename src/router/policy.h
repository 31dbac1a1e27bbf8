// Which worker gets a request (--policy):
//   cache        fewest blocks to prefill plus load: for each up worker,
//                (prompt blocks - leading blocks it holds) + load_weight x
//                prompt blocks x (its waiting + running + the router's
//                in-flight requests to it); ties go to the lighter load,
//                then round robin
//   round-robin  the next up worker in turn
//   least-load   the up worker with the smallest load, ties round robin
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvs::router {

enum class Policy { Cache, RoundRobin, LeastLoad };
std::optional<Policy> parse_policy(const std::string& s);
const char* to_string(Policy p);

struct Candidate {
  bool up = false;
  int hits = 0;       // leading prompt blocks the worker holds
  double load = 0;    // waiting + running + in flight from this router
};

// Index of the chosen candidate, or -1 when none is up. `excluded` (may be
// empty) marks workers already tried for this request. `turn` advances the
// round robin.
int choose(Policy p, const std::vector<Candidate>& c, int prompt_blocks, double load_weight, uint64_t turn,
           const std::vector<bool>& excluded = {});

// When every worker tried answered 429, the client gets the answer that
// lets it come back first. True when Retry-After `a` is sooner than `b`
// (delta-seconds; a missing or unreadable value is never sooner, so a
// client is not told to come back at once by accident).
bool sooner_retry(const std::string& a, const std::string& b);

}  // namespace kvs::router
