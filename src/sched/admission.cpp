#include "sched/admission.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "kv/capacity.h"

namespace kvs::sched {

static void check_share(const char* name, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi))
    throw std::invalid_argument(std::string("scheduler: ") + name + " must be in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "], got " + std::to_string(v));
}

// floor(total × share) in parts per million, so the limit is exact and the
// same on every machine.
static int64_t share_of(int64_t total, double share) {
  const int64_t ppm = int64_t(std::llround(share * 1e6));
  return total / 1000000 * ppm + (total % 1000000) * ppm / 1000000;
}

PoolLimits pool_limits(int64_t total, const SchedulerConfig& c) {
  if (total < 1) throw std::invalid_argument("scheduler: the KV pool has no blocks");
  check_share("--kv-headroom", c.kv_headroom, 0.0, 0.5);
  check_share("interactive reserve", c.interactive_reserve, 0.0, 0.5);
  check_share("--max-request-share", c.max_request_share, 1e-6, 1.0);
  check_share("tenant quota share", c.tenant_quota_share, 1e-6, 1e9);
  PoolLimits l;
  l.total = total;
  l.headroom = headroom_blocks(total, c.kv_headroom);
  l.interactive_reserve = headroom_blocks(total, c.interactive_reserve);
  // One request may always take one sequence's share of what the pool was
  // sized for: with --max-seqs 1 the whole pool (less headroom), or the only
  // sequence the server runs could not use its own context.
  const int64_t per_seq = total / std::max(1, c.max_seqs);
  l.request_cap = std::min(std::max(share_of(total, c.max_request_share), per_seq), total - l.headroom);
  l.tenant_quota = c.tenant_quota_share >= 1.0 ? std::numeric_limits<int64_t>::max()
                                               : share_of(total, c.tenant_quota_share);
  if (l.limit(SloClass::Batch) < 1)
    throw std::invalid_argument("scheduler: headroom (" + std::to_string(l.headroom) + ") and interactive reserve (" +
                                std::to_string(l.interactive_reserve) + ") leave no block of " +
                                std::to_string(total) + " for batch requests");
  return l;
}

int64_t request_footprint(int64_t prompt, int64_t max_tokens, int n, int bs) {
  if (n < 1) throw std::invalid_argument("request footprint: n must be >= 1");
  const int64_t one = request_blocks(prompt, max_tokens, bs, 0);
  // A fork shares the prompt's full blocks; its partial last block and its
  // generation are its own.
  const int64_t per_fork = one - prompt / bs;
  return one + int64_t(n - 1) * per_fork;
}

void DrainRate::add(int64_t blocks, double now) {
  if (last_ < 0) {
    last_ = now;
    pending_ = double(blocks);
    return;
  }
  pending_ += double(blocks);
  const double dt = now - last_;
  if (dt < 0.05) return;  // a fake or fast clock: accumulate over a meaningful interval
  const double inst = pending_ / dt;
  const double a = 1.0 - std::exp2(-dt / std::max(1e-3, halflife_));
  rate_ = seen_ ? rate_ + a * (inst - rate_) : inst;
  seen_ = true;
  pending_ = 0;
  last_ = now;
}

double DrainRate::rate(double now) const {
  if (!seen_) return 0;
  // Nothing freed for a while: the rate decays as if zeros had been seen.
  const double idle = now - last_;
  return idle > 0 ? rate_ * std::exp2(-idle / std::max(1e-3, halflife_)) : rate_;
}

void TokenRate::add(int64_t tokens, double seconds) {
  if (seconds <= 0 || tokens <= 0) return;
  const double inst = double(tokens) / seconds;
  const double a = 1.0 - std::exp2(-seconds / std::max(1e-3, halflife_));
  rate_ = seen_ ? rate_ + a * (inst - rate_) : inst;
  seen_ = true;
}

double retry_after_s(int64_t deficit, double rate, const SchedulerConfig& c) {
  double s = c.fallback_retry_after_s;
  if (deficit <= 0) s = c.min_retry_after_s;
  else if (rate > 1e-9) s = double(deficit) / rate;
  return std::clamp(std::ceil(s), c.min_retry_after_s, c.max_retry_after_s);
}

}  // namespace kvs::sched
