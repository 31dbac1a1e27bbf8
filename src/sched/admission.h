// Admission policy: pure arithmetic over block counts, no KV state, no
// clock of its own (callers pass `now`), so every decision is testable.
//
// Memory model. A request's *footprint* is the most blocks its tables can
// ever hold (prompt + max_tokens per choice, via kv/capacity.h); it bounds
// the request share and the tenant quota. Its *cost* at admission is what
// the pool may still have to hand out for it: blocks for prompt + max_tokens
// minus the prompt blocks already cached for its scope (request_blocks),
// plus the cached hits that leave the LRU and become pinned. The scheduler
// keeps  promised = used blocks + worst-case growth of running requests
// at or below  total - headroom  (the batch class: also minus the
// interactive reserve), so a running sequence never finds the pool empty.
#pragma once
#include <cstdint>

#include "sched/request.h"
#include "sched/sched_config.h"

namespace kvs::sched {

// Blocks held back for everyone / for interactive requests only, and the
// share limits, all computed once from the pool size (exact integers).
struct PoolLimits {
  int64_t total = 0;
  int64_t headroom = 0;             // ceil(total × kv_headroom)
  int64_t interactive_reserve = 0;  // ceil(total × interactive_reserve)
  int64_t request_cap = 0;          // max(floor(total × max_request_share), total / max_seqs), at most total - headroom
  int64_t tenant_quota = 0;         // floor(total × tenant_quota_share); INT64_MAX when off
  // The most a class may have promised in all: the batch class leaves the
  // interactive reserve alone.
  int64_t limit(SloClass effective) const {
    return total - headroom - (effective == SloClass::Batch ? interactive_reserve : 0);
  }
};
// Throws std::invalid_argument when a share is out of range or the pool
// cannot hold one block past the reserves.
PoolLimits pool_limits(int64_t total_blocks, const SchedulerConfig& c);

// Worst-case blocks of a request: prompt + max_tokens for the first choice;
// each further choice (a fork sharing the prompt's full blocks) adds the
// blocks past the prompt's last full block.
int64_t request_footprint(int64_t prompt_tokens, int64_t max_tokens, int n, int block_size);

// Blocks freed per second, exponentially smoothed (half-life in seconds)
// so one burst of completions does not swing Retry-After.
class DrainRate {
 public:
  explicit DrainRate(double halflife_s = 5.0) : halflife_(halflife_s) {}
  // `blocks` were returned to the pool at time `now`.
  void add(int64_t blocks, double now);
  double rate(double now) const;  // blocks per second (0 until a full interval was seen)

 private:
  double halflife_;
  double rate_ = 0, last_ = -1, pending_ = 0;
  bool seen_ = false;
};

// Tokens the model processes per second (prefill + decode), from busy
// steps only: each step's tokens over its measured duration, smoothed with
// the same half-life as DrainRate. Used to predict how long a new request
// would wait for admission behind the prompt tokens ahead of it.
class TokenRate {
 public:
  explicit TokenRate(double halflife_s = 5.0) : halflife_(halflife_s) {}
  void add(int64_t tokens, double seconds);  // one busy step
  double rate() const { return seen_ ? rate_ : 0.0; }  // 0 until a step was seen

 private:
  double halflife_;
  double rate_ = 0;
  bool seen_ = false;
};

// Seconds until `deficit_blocks` are likely free at the current drain rate,
// clamped to [min, max]; without any drain history, the fallback (the pool
// is idle or just started: a short retry is the honest answer).
double retry_after_s(int64_t deficit_blocks, double blocks_per_s, const SchedulerConfig& c);

}  // namespace kvs::sched
