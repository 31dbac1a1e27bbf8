// The scheduler's admission-time estimates: prefix blocks in flight, the
// prompt tokens a request will really run, and how long it would wait.
// All with mu_ held (called from submit() and step()).
#include <algorithm>

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
      if (c.seq < 0 || c.done || int(c.ctx.size()) - kv.num_tokens(c.seq) <= 1) continue;  // not prefilling
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
// prefill still to run; a decoding choice has none).
int64_t Scheduler::running_prefill_tokens() const {
  const KvManager& kv = exec_.kv();
  int64_t n = 0;
  for (const Req* r : running_)
    for (const Choice& c : r->ch)
      if (c.seq >= 0 && !c.done) n += std::max<int64_t>(0, int64_t(c.ctx.size()) - kv.num_tokens(c.seq) - 1);
  return n;
}

// mu_ held. Seconds a new request of class `cls` would likely wait for
// admission: the prompt tokens still to run ahead of it (running prefills,
// then queued requests of its class or a more urgent one), less one step's
// budget, at the measured token rate. 0 until a rate was measured.
double Scheduler::predicted_wait_s(SloClass cls) const {
  const double rate = tok_rate_.rate();
  if (rate <= 0) return 0;
  int64_t ahead = running_prefill_tokens();
  for (int k = 0; k <= int(cls); ++k)
    for (const Req* q : queue_[size_t(k)]) ahead += q->est_tokens;
  return double(std::max<int64_t>(0, ahead - cfg_.max_batch_tokens)) / rate;
}

}  // namespace kvs::sched
