// The scheduler's admission-time estimates: prefix blocks in flight, the
// prompt tokens a request will really run, and how long it would wait.
// All with mu_ held (called from submit() and step()).
#include <algorithm>
#include <cmath>

#include "sched/scheduler.h"
#include "sched/scheduler_internal.h"

namespace kvs::sched {

// mu_ held. True when a running sequence in the same cache scope is still
// prefilling full blocks that `h`'s prompt shares and the cache does not hold
// yet. Admitting `h` now would compute that prefix a second time; after the
// running prefill commits those blocks, `h` admits as a cache hit. (A burst
// of requests with one system prompt: only the first computes it.)
bool Scheduler::awaits_inflight_prefix(const Req& h) const {
  const KvManager& kv = exec_.kv();
  if (!kv.prefix_caching() || h.ch.empty()) return false;
  const std::vector<int32_t>& p = h.ch[0].ctx;
  const int bs = kv.block_size();
  if (int(p.size()) < 2 * bs) return false;  // at most one full block: not worth a step
  const int64_t cached = kv.cached_prefix_blocks(p, exec_.kv_scope(h.r.scope));
  for (const Req* r : running_) {
    if (!(r->r.scope == h.r.scope)) continue;
    for (const Choice& c : r->ch) {
      if (c.seq < 0 || c.done || int(c.ctx.size()) - c.have <= 1) continue;  // not prefilling
      const size_t common = common_prefix(p, c.ctx);
      // The prompt's last token is always computed, so a block ending there cannot be a hit.
      const int64_t shared = int64_t(std::min(common, p.size() - 1)) / bs;
      if (shared > cached) return true;
    }
  }
  return false;
}

// mu_ held. Prompt tokens a new request will likely put through the model:
// its prompt minus the longest full-block prefix it can reuse, whether cached
// now or being computed by a running or queued request of the same scope
// (which it will wait for, see awaits_inflight_prefix).
int64_t Scheduler::estimate_tokens(const Request& req) const {
  const int64_t P = int64_t(req.prompt.size());
  const KvManager& kv = exec_.kv();
  if (!kv.prefix_caching()) return P;
  int64_t reuse = int64_t(kv.cached_prefix_blocks(req.prompt, exec_.kv_scope(req.scope))) * bs_;
  auto consider = [&](const Req* o) {
    if (!(o->r.scope == req.scope)) return;
    reuse = std::max<int64_t>(reuse, int64_t(common_prefix(o->r.prompt, req.prompt)) / bs_ * bs_);
  };
  for (const Req* o : running_) consider(o);
  for (const auto& q : queue_)
    for (const Req* o : q) consider(o);
  return P - std::min(reuse, P - 1);
}

// mu_ held. Context tokens of running choices not yet in the cache (their
// prefill still to run; a decoding choice has none) that will run before a
// new request of class `cls`: all of those of its class or a more urgent one.
// A less urgent request's prefill goes after it (plan_running orders chunks
// by class), so at most the step that may be running now counts. Reads the
// scheduler's own count of cached tokens, never the KV manager: submit()
// calls it while a forward runs.
int64_t Scheduler::running_prefill_tokens(SloClass cls, double now) const {
  int64_t n = 0, later = 0;
  for (const Req* r : running_) {
    int64_t t = 0;
    for (const Choice& c : r->ch)
      if (c.seq >= 0 && !c.done) t += std::max<int64_t>(0, int64_t(c.ctx.size()) - c.have - 1);
    (effective(*r, now) <= cls ? n : later) += t;
  }
  return n + std::min<int64_t>(later, cfg_.max_batch_tokens);
}

// mu_ held. Prompt tokens that will run before a new request of class `cls`:
// running prefills ahead of it, then queued requests of its class or a more
// urgent one.
int64_t Scheduler::tokens_ahead(SloClass cls, double now) const {
  int64_t ahead = running_prefill_tokens(cls, now);
  for (int k = 0; k <= int(cls); ++k)
    for (const Req* q : queue_[size_t(k)]) ahead += q->est_tokens;
  return ahead;
}

// Seconds until the first token of a request with `own` prompt tokens to
// run behind `ahead` others, at the measured rate; 0 until a rate is known.
double Scheduler::predicted_ttft_s(int64_t ahead, int64_t own) const {
  const double rate = tok_rate_.rate();
  return rate > 0 ? double(ahead + own) / rate : 0.0;
}

// Seconds of waiting a request of class `cls` may still afford: its class's
// limit (times the margin) less its own prefill at the measured rate.
double Scheduler::wait_slack_s(int64_t own, SloClass cls) const {
  const double rate = tok_rate_.rate();
  const double limit = cfg_.wait_limit_s[size_t(cls)] * cfg_.ttft_margin;
  return rate > 0 ? std::max(0.0, limit - double(own) / rate) : limit;
}

// True when the work ahead would push a request's first token past its
// class's limit, given it has already waited `waited` seconds. Never with
// nothing ahead (a prompt too long to meet the limit even alone still runs
// on an idle engine) or before a rate was measured (an idle engine admits,
// and its first busy steps measure the rate).
bool Scheduler::too_late(int64_t ahead, int64_t own, SloClass cls, double waited) const {
  const double rate = tok_rate_.rate();
  if (rate <= 0 || ahead <= 0) return false;
  return double(ahead) / rate > wait_slack_s(own, cls) - waited;
}

// mu_ held. Retry-After for a request turned away because its first token
// would come too late: the time at which the work ahead of it (including
// clients told to come back earlier) will have drained enough for it to
// fit its class's limit. Books it in the ledger, so the next client turned
// away is told a later time.
double Scheduler::time_retry_after(int64_t ahead, int64_t own, SloClass cls, uint64_t fp, double now) {
  const double rate = tok_rate_.rate();
  double s = cfg_.fallback_retry_after_s;
  const double pad = cfg_.retry_pad_share * cfg_.wait_limit_s[size_t(cls)];
  if (rate > 0) s = double(ahead) / rate - wait_slack_s(own, cls) + pad;
  s = std::clamp(std::ceil(s), cfg_.min_retry_after_s, cfg_.max_retry_after_s);
  ledger_.book(fp, now + s, own);
  return s;
}

// Prefill tokens one step needs to set the first prefill rate.
int Scheduler::cold_sample_tokens() const {
  return std::max(1, std::min(cfg_.rate_sample_tokens, cfg_.max_batch_tokens / 2));
}

}  // namespace kvs::sched
