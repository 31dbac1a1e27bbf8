// Internal to src/sched: the scheduler's per-request state, shared by
// scheduler.cpp (the step loop) and scheduler_estimates.cpp (admission-time
// estimates). Engine thread / mu_ only.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "sched/scheduler.h"

namespace kvs::sched {

// One choice (n > 1 gives several) of a request: its context is prompt +
// generated tokens; the sequence holds K/V of a prefix of it.
struct Choice {
  std::vector<int32_t> ctx;      // prompt + generated
  int n_gen = 0;
  SeqId seq = -1;                // -1: not resident (queued, preempted, pending fork, done)
  std::unique_ptr<Sampler> sampler;
  std::vector<int> hist;         // prompt + generated as int, only with a repetition penalty
  bool done = false;
  bool fork_pending = false;     // n > 1: forked from choice 0 once its prompt is prefilled
};

struct Scheduler::Req {
  RequestId id = 0;
  Request r;
  int max_tokens = 0;            // after the default cap and the context clamp
  int64_t footprint = 0;         // request_footprint: share cap and tenant ledger
  double arrival = 0;
  bool started = false;          // admitted at least once (never times out after that)
  bool running = false;
  bool ended = false;
  uint64_t admit_order = 0;
  int cached_tokens = 0;
  int64_t est_tokens = 0;        // prompt tokens it will likely run (cached / shared prefix excluded), at submit
  std::vector<Choice> ch;
};

// Length of the common prefix of two token sequences.
inline size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace kvs::sched
