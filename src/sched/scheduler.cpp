#include "sched/scheduler.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "kv/capacity.h"
#include "sched/scheduler_internal.h"

namespace kvs::sched {

// A planned slice of one choice's context: ctx[from, from + n).
struct Scheduler::Item {
  Req* r;
  int c;
  int from, n;
};

Scheduler::Scheduler(StepExecutor& exec, const SchedulerConfig& cfg, std::function<bool(int32_t)> is_eog,
                     std::function<void(const std::string&)> log)
    : exec_(exec),
      cfg_(cfg),
      lim_(pool_limits(exec.kv().pool().size(), cfg)),
      bs_(exec.kv().block_size()),
      is_eog_(std::move(is_eog)),
      log_(std::move(log)),
      drain_(cfg.drain_halflife_s),
      tok_rate_(cfg.drain_halflife_s) {
  if (cfg.max_batch_tokens < 1) throw std::invalid_argument("--max-batch-tokens must be >= 1");
  if (cfg.max_seqs < 1) throw std::invalid_argument("--max-seqs must be >= 1");
  if (cfg.max_queue < 0) throw std::invalid_argument("--max-queue must be >= 0");
  if (cfg.default_max_tokens < 1) throw std::invalid_argument("default max_tokens must be >= 1");
  st_.total_blocks = lim_.total;
  st_.headroom_blocks = lim_.headroom;
}

Scheduler::~Scheduler() = default;

static std::string tenant_hash(const std::string& t) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016zx", std::hash<std::string>{}(t));
  return buf;
}

std::string Scheduler::log_fields(const Request& req, int64_t need) const {
  return "class=" + std::string(to_string(req.slo)) + " tenant=" + tenant_hash(req.tenant) +
         " prompt_tokens=" + std::to_string(req.prompt.size()) +
         " max_tokens=" + (req.max_tokens ? std::to_string(*req.max_tokens) : std::string("default")) +
         " n=" + std::to_string(req.n) + " need_blocks=" + std::to_string(need);
}

// Blocks that must drain before a request needing `need` blocks could be
// admitted: everything queued at its priority or above, plus itself, minus
// what its class may still be promised. mu_ held.
double Scheduler::retry_estimate(int64_t need, SloClass cls, double now) const {
  int64_t ahead = 0;
  for (int k = 0; k <= int(cls); ++k)
    for (const Req* q : queue_[k]) ahead += q->footprint;
  const int64_t room = lim_.limit(cls) - promised_published_;
  return retry_after_s(ahead + need - room, drain_.rate(now), cfg_);
}

SubmitResult Scheduler::reject_submit(const Request& req, int64_t need, RejectReason why, std::string msg,
                                      double now) {
  SubmitResult res;
  res.id = req.id;
  res.reason = why;
  res.need_blocks = need;
  res.message = std::move(msg);
  if (retryable(why)) res.retry_after_s = retry_estimate(need, req.slo, now);
  ++st_.rejections[size_t(why)];
  if (log_) {
    char ra[32];
    std::snprintf(ra, sizeof ra, "%.0f", res.retry_after_s);
    log_("reject reason=" + std::string(to_string(why)) + " " + log_fields(req, need) + " retry_after_s=" + ra);
  }
  return res;
}

SubmitResult Scheduler::submit(Request req, double now) {
  std::lock_guard lk(mu_);
  ++st_.submitted;
  const int max_ctx = exec_.max_ctx();
  const int64_t P = int64_t(req.prompt.size());
  if (!accepting_) return reject_submit(req, 0, RejectReason::ShuttingDown, "the server is shutting down", now);
  auto invalid = [&](const std::string& m) { return reject_submit(req, 0, RejectReason::Invalid, m, now); };
  if (P == 0) return invalid("the prompt has no tokens");
  const int nv = exec_.n_vocab();
  for (int32_t t : req.prompt)
    if (t < 0 || t >= nv) return invalid("prompt token id " + std::to_string(t) + " is outside the vocabulary");
  if (req.n < 1 || req.n > cfg_.max_seqs) return invalid("n must be between 1 and " + std::to_string(cfg_.max_seqs));
  if (req.max_tokens && *req.max_tokens < 1) return invalid("max_tokens must be >= 1");
  if (req.top_logprobs < 0 || req.top_logprobs > 20) return invalid("top_logprobs must be between 0 and 20");
  if (req.id != 0 && reqs_.count(req.id)) return invalid("request id " + std::to_string(req.id) + " is in use");
  if (P >= max_ctx)
    return reject_submit(req, 0, RejectReason::ContextLength,
                         "prompt of " + std::to_string(P) + " tokens leaves no room in the context of " +
                             std::to_string(max_ctx),
                         now);
  // max_tokens is a hard stop; it is also clamped to the context window.
  const int max_tokens = int(std::min<int64_t>(req.max_tokens.value_or(cfg_.default_max_tokens), max_ctx - P));
  // Under a bounding window policy no choice ever holds more than live_cap.
  const int64_t cap = exec_.kv().live_cap();
  const int64_t need = cap == INT64_MAX ? request_footprint(P, max_tokens, req.n, bs_)
                                        : std::min(request_footprint(P, max_tokens, req.n, bs_), cap * req.n);
  if (need > lim_.request_cap)
    return reject_submit(req, need, RejectReason::RequestShare,
                         "request needs up to " + std::to_string(need) + " KV blocks (" + std::to_string(P) +
                             " prompt + " + std::to_string(max_tokens) + " new tokens, n=" + std::to_string(req.n) +
                             "); one request may use at most " + std::to_string(lim_.request_cap) + " of " +
                             std::to_string(lim_.total),
                         now);
  int queued = 0;
  for (const auto& q : queue_) queued += int(q.size());
  if (queued >= cfg_.max_queue)
    return reject_submit(req, need, RejectReason::QueueFull,
                         "the queue is full (" + std::to_string(queued) + " requests waiting)", now);
  int64_t& tb = tenant_blocks_[req.tenant];
  if (tb + need > lim_.tenant_quota) {
    SubmitResult res = reject_submit(req, need, RejectReason::TenantQuota,
                                     "tenant quota: " + std::to_string(tb) + " blocks in use or queued + " +
                                         std::to_string(need) + " requested > quota " +
                                         std::to_string(lim_.tenant_quota),
                                     now);
    // The tenant's own work must drain first: estimate from its excess.
    res.retry_after_s = retry_after_s(tb + need - lim_.tenant_quota, drain_.rate(now), cfg_);
    if (tb == 0) tenant_blocks_.erase(req.tenant);
    return res;
  }
  // A request that would wait past its class's limit is told so now, not
  // after the wait (a burst of long prompts on a busy engine).
  const int64_t est = estimate_tokens(req);
  const double wait = predicted_wait_s(req.slo);
  if (wait > cfg_.wait_limit_s[size_t(req.slo)]) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "the engine is busy: admission would take about %.0f s (%s requests wait at most %.0f s)", wait,
                  to_string(req.slo), cfg_.wait_limit_s[size_t(req.slo)]);
    SubmitResult res = reject_submit(req, need, RejectReason::QueueTimeout, buf, now);
    res.retry_after_s = std::clamp(std::ceil(wait), cfg_.min_retry_after_s, cfg_.max_retry_after_s);
    if (tb == 0) tenant_blocks_.erase(req.tenant);
    return res;
  }
  auto q = std::make_unique<Req>();
  if (req.id == 0) {
    while (reqs_.count(next_id_)) ++next_id_;
    req.id = next_id_++;
  }
  q->id = req.id;
  q->max_tokens = max_tokens;
  q->footprint = need;
  q->est_tokens = est;
  q->arrival = now;
  q->ch.resize(size_t(req.n));
  for (int i = 0; i < req.n; ++i) {
    Choice& c = q->ch[size_t(i)];
    c.ctx = req.prompt;
    SamplingParams sp = req.sampling;
    sp.seed += uint64_t(i);
    c.sampler = std::make_unique<Sampler>(sp);
    if (sp.repeat_penalty != 1.0f) c.hist.assign(req.prompt.begin(), req.prompt.end());
  }
  req.sink = nullptr;  // events leave through the engine loop, not the scheduler
  q->r = std::move(req);
  tb += need;
  SubmitResult res;
  res.accepted = true;
  res.id = q->id;
  res.need_blocks = need;
  queue_[size_t(q->r.slo)].push_back(q.get());
  reqs_.emplace(q->id, std::move(q));
  return res;
}

bool Scheduler::cancel(RequestId id) {
  std::lock_guard lk(mu_);
  auto it = reqs_.find(id);
  if (it == reqs_.end() || it->second->ended) return false;
  return cancels_.insert(id).second;
}

void Scheduler::set_accepting(bool on) {
  std::lock_guard lk(mu_);
  accepting_ = on;
}

bool Scheduler::has_work() const {
  std::lock_guard lk(mu_);
  return !reqs_.empty();
}

SloClass Scheduler::effective(const Req& r, double now) const {
  if (r.r.slo == SloClass::Batch && now - r.arrival >= cfg_.batch_age_s) return SloClass::Interactive;
  return r.r.slo;
}

int Scheduler::running_seqs() const {
  int n = 0;
  for (const Req* r : running_)
    for (const Choice& c : r->ch) n += c.seq >= 0 || c.fork_pending;
  return n;
}

// Worst-case blocks a running request may still take from the pool: each
// resident choice up to its horizon (prompt + max_tokens, or with optimistic
// reservation just its current context), copies of shared blocks included;
// each pending fork its private tail.
int64_t Scheduler::outstanding(const Req& r) const {
  const KvManager& kv = exec_.kv();
  const int64_t P = int64_t(r.r.prompt.size());
  const int64_t full = P + r.max_tokens;
  int64_t sum = 0;
  for (const Choice& c : r.ch) {
    if (c.seq >= 0) {
      const int64_t horizon = cfg_.worst_case_reservation ? full : int64_t(c.ctx.size());
      sum += kv.horizon_blocks(c.seq, horizon);
    } else if (c.fork_pending) {
      sum += cfg_.worst_case_reservation ? std::min(blocks_for_tokens(full, bs_) - P / bs_, kv.live_cap()) : 1;
    }
  }
  return sum;
}

int64_t Scheduler::promised_blocks() const {
  int64_t p = exec_.kv().pool().n_used();
  for (const Req* r : running_) p += outstanding(*r);
  return p;
}

// Upper bound on how much admitting `r` raises promised_blocks(): per
// choice to add, its blocks past the cached prefix (request_blocks), the
// cached hits that leave the LRU and become pinned, and one copy when the
// whole context is cached (its last block is recomputed into a copy).
int64_t Scheduler::admission_cost(const Req& r) const {
  const KvManager& kv = exec_.kv();
  const BlockPool& pool = kv.pool();
  const Scope scope = exec_.kv_scope(r.r.scope);
  const int64_t P = int64_t(r.r.prompt.size());
  const int64_t full = P + r.max_tokens;
  bool any_gen = false;
  for (const Choice& c : r.ch) any_gen |= c.n_gen > 0;
  int64_t cost = 0;
  for (size_t i = 0; i < r.ch.size(); ++i) {
    const Choice& c = r.ch[i];
    if (c.done) continue;
    if (!any_gen && i > 0) {  // forked later from choice 0
      cost += cfg_.worst_case_reservation ? std::min(blocks_for_tokens(full, bs_) - P / bs_, kv.live_cap()) : 1;
      continue;
    }
    const int64_t len = int64_t(c.ctx.size());
    int64_t hits = 0, revived = 0;
    if (kv.prefix_caching()) {
      BlockKey k{};
      for (int64_t b = 0; (b + 1) * bs_ <= len; ++b) {
        k = block_key(b ? &k : nullptr, c.ctx.data() + b * bs_, bs_, scope);
        auto blk = pool.lookup(k);
        if (!blk) break;
        ++hits;
        revived += pool.state(*blk) == BlockState::Cached;
      }
    }
    const int64_t horizon = cfg_.worst_case_reservation ? full : len + 1;
    cost += revived + std::min(request_blocks(len, std::max<int64_t>(0, horizon - len), bs_, hits), kv.live_cap()) +
            (hits * bs_ == len ? 1 : 0);
  }
  return cost;
}

Scheduler::Req* Scheduler::queue_head(double now) {
  Req* i = queue_[0].empty() ? nullptr : queue_[0].front();
  Req* b = queue_[1].empty() ? nullptr : queue_[1].front();
  if (b && effective(*b, now) == SloClass::Interactive && (!i || b->arrival < i->arrival)) return b;
  return i ? i : b;
}

void Scheduler::remove_queued(Req* r) {
  auto& q = queue_[size_t(r->r.slo)];
  q.erase(std::find(q.begin(), q.end(), r));
}

// Back into its class queue at its arrival position: a preempted request
// resumes before anything that arrived after it.
void Scheduler::requeue(Req* r) {
  auto& q = queue_[size_t(r->r.slo)];
  auto at = std::find_if(q.begin(), q.end(), [&](const Req* o) { return o->arrival > r->arrival; });
  q.insert(at, r);
}

void Scheduler::release_seq(int64_t& seq) {
  const int32_t before = exec_.kv().pool().n_available();
  exec_.release(seq);
  freed_this_step_ += exec_.kv().pool().n_available() - before;
  seq = -1;
}

void Scheduler::preempt(Req* r, std::vector<Item>& plan, StepReport& rep) {
  for (Choice& c : r->ch)
    if (c.seq >= 0) release_seq(c.seq);
  r->running = false;
  running_.erase(std::find(running_.begin(), running_.end(), r));
  plan.erase(std::remove_if(plan.begin(), plan.end(), [&](const Item& it) { return it.r == r; }), plan.end());
  requeue(r);
  ++st_.preemptions;
  rep.preempted.push_back(r->id);
}

// Preempts batch requests (most recently admitted first) until `need` more
// blocks fit under `limit`; does nothing unless that can succeed.
bool Scheduler::make_room(int64_t need, int64_t limit, std::vector<Item>& plan, StepReport& rep, double now) {
  std::vector<Req*> victims;
  for (Req* r : running_)
    if (effective(*r, now) == SloClass::Batch) victims.push_back(r);
  std::sort(victims.begin(), victims.end(), [](const Req* a, const Req* b) { return a->admit_order > b->admit_order; });
  // Lower bound of what preempting all of them frees: their growth plus the
  // blocks only they hold.
  const BlockPool& pool = exec_.kv().pool();
  int64_t freeable = 0;
  for (const Req* r : victims) {
    freeable += outstanding(*r);
    for (const Choice& c : r->ch)
      if (c.seq >= 0)
        for (int32_t b : exec_.kv().block_table(c.seq)) freeable += pool.ref_count(b) == 1;
  }
  if (promised_blocks() + need - freeable > limit) return false;
  for (Req* v : victims) {
    if (promised_blocks() + need <= limit) break;
    preempt(v, plan, rep);
  }
  return promised_blocks() + need <= limit;
}

bool Scheduler::admit(Req* r, int& budget, std::vector<Item>& plan, double now) {
  bool any_gen = false;
  for (const Choice& c : r->ch) any_gen |= c.n_gen > 0;
  const bool first = !r->started;
  for (size_t i = 0; i < r->ch.size(); ++i) {
    Choice& c = r->ch[i];
    if (c.done) continue;
    if (!any_gen && i > 0) {
      c.fork_pending = true;
      continue;
    }
    const SeqAdmission a = exec_.add(c.ctx, r->r.scope);
    c.seq = a.seq;
    if (first && i == 0) r->cached_tokens = a.cached_tokens;
    const int rem = int(c.ctx.size()) - a.cached_tokens;
    const int n = std::min(rem, budget);
    if (n > 0) {
      plan.push_back({r, int(i), a.cached_tokens, n});
      budget -= n;
    }
  }
  if (first) st_.prompt_tokens += int64_t(r->r.prompt.size());
  r->started = true;
  r->running = true;
  r->admit_order = ++admit_counter_;
  running_.push_back(r);
  (void)now;
  return true;
}

void Scheduler::reject_locked(Req* r, RejectReason why, double now, std::vector<TokenEvent>& out) {
  const double ra = retryable(why) ? retry_estimate(r->footprint, r->r.slo, now) : 0;
  ++st_.rejections[size_t(why)];
  if (log_) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", ra);
    log_("reject reason=" + std::string(to_string(why)) + " " + log_fields(r->r, r->footprint) +
         " retry_after_s=" + buf);
  }
  for (size_t i = 0; i < r->ch.size(); ++i) {
    TokenEvent e;
    e.request = r->id;
    e.choice = int(i);
    e.finish = FinishReason::Rejected;
    e.reject_reason = why;
    e.retry_after_s = ra;
    e.message = why == RejectReason::QueueTimeout ? "not admitted within the " + std::string(to_string(r->r.slo)) +
                                                        " wait limit; retry later"
                                                  : "the server is shutting down";
    e.usage.prompt_tokens = int(r->r.prompt.size());
    out.push_back(std::move(e));
    r->ch[i].done = true;
  }
  end_request(r);
}

// mu_ held. The request leaves every structure; its Req is destroyed.
void Scheduler::end_request(Req* r) {
  for (Choice& c : r->ch)
    if (c.seq >= 0) release_seq(c.seq);
  if (r->running) running_.erase(std::find(running_.begin(), running_.end(), r));
  r->running = false;
  r->ended = true;
  auto it = tenant_blocks_.find(r->r.tenant);
  if (it != tenant_blocks_.end() && (it->second -= r->footprint) <= 0) tenant_blocks_.erase(it);
  cancels_.erase(r->id);
  auto node = reqs_.find(r->id);
  ended_.push_back(std::move(node->second));
  reqs_.erase(node);
}

Usage Scheduler::usage(RequestId id) const {
  std::lock_guard lk(mu_);
  auto it = reqs_.find(id);
  Usage u;
  if (it == reqs_.end()) return u;
  const Req& r = *it->second;
  u.prompt_tokens = int(r.r.prompt.size());
  u.cached_tokens = r.cached_tokens;
  for (const Choice& c : r.ch) u.completion_tokens += c.n_gen;
  return u;
}

// mu_ held. Ends one choice with a final event (token -1 when none).
void Scheduler::finish_choice(Req* r, int ci, FinishReason why, int32_t token, std::vector<TokenEvent>& out) {
  Choice& c = r->ch[size_t(ci)];
  if (c.seq >= 0) release_seq(c.seq);
  c.done = true;
  c.fork_pending = false;
  bool last = true;
  for (const Choice& o : r->ch) last &= o.done;
  if (token >= 0 && !out.empty() && out.back().request == r->id && out.back().choice == ci && out.back().token == token) {
    out.back().finish = why;
  } else {
    TokenEvent e;
    e.request = r->id;
    e.choice = ci;
    e.finish = why;
    out.push_back(std::move(e));
  }
  TokenEvent& e = out.back();
  e.usage.prompt_tokens = int(r->r.prompt.size());
  e.usage.cached_tokens = r->cached_tokens;
  for (const Choice& o : r->ch) e.usage.completion_tokens += o.n_gen;
  if (why == FinishReason::Cancelled) ++st_.cancelled;
  if (last) {
    ++st_.finished;
    end_request(r);
  }
}

static void log_softmax_row(const float* x, int n, std::vector<float>& out) {
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const float lse = float(mx + std::log(sum));
  out.resize(size_t(n));
  for (int i = 0; i < n; ++i) out[size_t(i)] = x[i] - lse;
}

// mu_ held. Samples choice `ci`'s next token from its logits row.
void Scheduler::sample_choice(Req* r, int ci, const float* logits, int nv, std::vector<TokenEvent>& out) {
  Choice& c = r->ch[size_t(ci)];
  const int32_t t = c.sampler->sample(logits, nv, c.hist);
  if (is_eog_ && !r->r.ignore_eos && is_eog_(t)) {
    finish_choice(r, ci, FinishReason::Stop, -1, out);
    return;
  }
  TokenEvent e;
  e.request = r->id;
  e.choice = ci;
  e.token = t;
  if (r->r.logprobs || r->r.top_logprobs > 0) {
    std::vector<float> lp;
    log_softmax_row(logits, nv, lp);
    e.logprob = TokenLogprob{t, lp[size_t(t)]};
    std::vector<int> idx(static_cast<size_t>(nv));
    for (int i = 0; i < nv; ++i) idx[size_t(i)] = i;
    const int k = std::min(r->r.top_logprobs, nv);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return lp[size_t(a)] != lp[size_t(b)] ? lp[size_t(a)] > lp[size_t(b)] : a < b; });
    for (int i = 0; i < k; ++i) e.top_logprobs.push_back({idx[size_t(i)], lp[size_t(idx[size_t(i)])]});
  }
  out.push_back(std::move(e));
  c.ctx.push_back(t);
  if (!c.hist.empty()) c.hist.push_back(t);
  ++c.n_gen;
  ++st_.generated_tokens;
  if (c.n_gen >= r->max_tokens || int(c.ctx.size()) >= exec_.max_ctx())
    finish_choice(r, ci, FinishReason::Length, t, out);
}

StepReport Scheduler::step(double now, std::vector<TokenEvent>& out) {
  std::lock_guard lk(mu_);
  // The previous step's tokens over its duration (busy steps only).
  if (last_step_tokens_ > 0 && now > last_step_at_) tok_rate_.add(last_step_tokens_, now - last_step_at_);
  last_step_tokens_ = 0;
  last_step_at_ = now;
  StepReport rep;
  ended_.clear();
  // 1. Cancellations free their blocks before anything is planned.
  for (RequestId id : std::vector<RequestId>(cancels_.begin(), cancels_.end())) {
    auto it = reqs_.find(id);
    if (it == reqs_.end()) continue;
    Req* r = it->second.get();
    if (!r->running) remove_queued(r);
    for (size_t i = 0; i < r->ch.size(); ++i)
      if (!r->ch[i].done) finish_choice(r, int(i), FinishReason::Cancelled, -1, out);
  }
  cancels_.clear();
  // 2. Wait limits (only requests that never ran: a preempted one has
  //    already streamed tokens and is finished, not rejected). With a
  //    measured prefill rate, a request that cannot be admitted before its
  //    limit (the prompt tokens ahead of it at that rate) is rejected now,
  //    not when the limit passes: a burst gets its 429s at once.
  const double rate = tok_rate_.rate();
  int64_t ahead = running_prefill_tokens();
  for (int k = 0; k < kNumSloClasses; ++k) {
    std::vector<Req*> expired;
    for (Req* r : queue_[size_t(k)]) {
      const double deadline = r->arrival + cfg_.wait_limit_s[size_t(k)];
      const double eta = rate > 0 ? now + double(std::max<int64_t>(0, ahead - cfg_.max_batch_tokens)) / rate : now;
      if (!r->started && (now > deadline || eta > deadline)) expired.push_back(r);
      else ahead += r->started ? int64_t(r->ch[0].ctx.size()) : r->est_tokens;
    }
    for (Req* r : expired) {
      remove_queued(r);
      reject_locked(r, RejectReason::QueueTimeout, now, out);
    }
  }
  // 3. Plan: decodes first, then prefill chunks, in priority order.
  std::vector<Req*> order = running_;
  std::stable_sort(order.begin(), order.end(), [&](const Req* a, const Req* b) {
    const SloClass ea = effective(*a, now), eb = effective(*b, now);
    return ea != eb ? ea < eb : a->admit_order < b->admit_order;
  });
  const KvManager& kv = exec_.kv();
  std::vector<Item> plan;
  int budget = cfg_.max_batch_tokens;
  for (Req* r : order)
    for (size_t i = 0; i < r->ch.size(); ++i) {
      const Choice& c = r->ch[i];
      if (c.seq < 0 || budget <= 0) continue;
      const int have = kv.num_tokens(c.seq);
      if (int(c.ctx.size()) - have == 1) {
        plan.push_back({r, int(i), have, 1});
        --budget;
      }
    }
  for (Req* r : order)
    for (size_t i = 0; i < r->ch.size(); ++i) {
      const Choice& c = r->ch[i];
      if (c.seq < 0 || budget <= 0) continue;
      const int have = kv.num_tokens(c.seq), rem = int(c.ctx.size()) - have;
      if (rem > 1) {
        const int n = std::min(rem, budget);
        plan.push_back({r, int(i), have, n});
        budget -= n;
      }
    }
  // Admissions: strict priority, the head is never bypassed.
  while (budget > 0) {
    Req* h = queue_head(now);
    if (!h) break;
    int new_seqs = 0;
    bool any_gen = false;
    for (const Choice& c : h->ch) any_gen |= c.n_gen > 0;
    for (const Choice& c : h->ch) new_seqs += !c.done;
    if (running_seqs() + new_seqs > cfg_.max_seqs) break;
    const SloClass eff = effective(*h, now);
    const int64_t cost = admission_cost(*h);
    const int64_t limit = lim_.limit(eff);
    if (promised_blocks() + cost > limit) {
      if (eff != SloClass::Interactive || !make_room(cost, limit, plan, rep, now)) break;
      // Preempted requests were re-queued: re-plan the budget they held.
      budget = cfg_.max_batch_tokens;
      for (const Item& it : plan) budget -= it.n;
      if (budget <= 0) break;
    }
    if (awaits_inflight_prefix(*h)) {
      ++st_.prefix_waits;
      break;
    }
    remove_queued(h);
    admit(h, budget, plan, now);
    rep.admitted.push_back(h->id);
  }
  // 4. Run. Without worst-case reservation a step may find too few blocks:
  //    preempt the lowest-priority, most recently admitted request and retry.
  StepResult res;
  std::vector<SeqStep> items;
  while (true) {
    items.clear();
    for (const Item& it : plan) {
      const Choice& c = it.r->ch[size_t(it.c)];
      items.push_back({c.seq, std::span<const int32_t>(c.ctx.data() + it.from, size_t(it.n)), false});
    }
    if (items.empty()) break;
    res = exec_.step(items);
    if (res.ok) break;
    Req* victim = nullptr;
    for (Req* r : running_)
      if (!victim || effective(*r, now) > effective(*victim, now) ||
          (effective(*r, now) == effective(*victim, now) && r->admit_order > victim->admit_order))
        victim = r;
    assert(victim);
    preempt(victim, plan, rep);
  }
  // 5. Sample every choice whose context is now fully in the cache.
  if (!items.empty()) {
    ++st_.steps;
    for (size_t k = 0; k < plan.size(); ++k) {
      const Item& it = plan[k];
      Req* r = it.r;
      Choice& c = r->ch[size_t(it.c)];
      if (it.n == 1 && it.from + 1 == int(c.ctx.size()) && c.n_gen > 0) ++rep.decode_tokens;
      else {
        rep.prefill_tokens += it.n;
        st_.prefill_tokens += it.n;
      }
      ++rep.seqs;
    }
    for (size_t k = 0; k < plan.size(); ++k) {
      const Item& it = plan[k];
      Req* r = it.r;
      if (r->ended) continue;
      Choice& c = r->ch[size_t(it.c)];
      if (c.done || c.seq < 0 || kv.num_tokens(c.seq) != int(c.ctx.size())) continue;
      const float* row = res.logits_of(k);
      // n > 1: the other choices fork off choice 0 once the prompt is in.
      if (it.c == 0 && c.n_gen == 0)
        for (size_t j = 1; j < r->ch.size(); ++j)
          if (r->ch[j].fork_pending) {
            r->ch[j].fork_pending = false;
            r->ch[j].seq = exec_.fork(c.seq);
          }
      const bool forked_now = it.c == 0 && c.n_gen == 0 && r->ch.size() > 1;
      sample_choice(r, it.c, row, res.n_vocab, out);
      if (forked_now)
        for (size_t j = 1; j < r->ch.size() && !r->ended; ++j)
          if (!r->ch[j].done && r->ch[j].n_gen == 0) sample_choice(r, int(j), row, res.n_vocab, out);
    }
  }
  drain_.add(freed_this_step_, now);
  freed_this_step_ = 0;
  promised_published_ = promised_blocks();
  // The prefill rate: steps that were mostly prefill, timed by the next
  // step's start. That follows at once only while work remains (an idle
  // engine thread waits, and that wait is not step time). Decode-only steps
  // are not counted: their few tokens per weight pass would understate how
  // fast queued prompts are served.
  bool more = !running_.empty();
  for (const auto& q : queue_) more = more || !q.empty();
  if (more && 2 * rep.prefill_tokens >= cfg_.max_batch_tokens) last_step_tokens_ = rep.prefill_tokens + rep.decode_tokens;
  return rep;
}

void Scheduler::end_choice(RequestId id, int choice) {
  std::lock_guard lk(mu_);
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return;
  Req* r = it->second.get();
  Choice& c = r->ch.at(size_t(choice));
  if (c.done) return;
  if (c.seq >= 0) release_seq(c.seq);
  c.done = true;
  c.fork_pending = false;
  bool last = true;
  for (const Choice& o : r->ch) last &= o.done;
  if (last) {
    ++st_.finished;
    end_request(r);
  }
}

void Scheduler::abort_all(RejectReason why, double now, std::vector<TokenEvent>& out) {
  std::lock_guard lk(mu_);
  accepting_ = false;
  for (auto& q : queue_) {
    std::vector<Req*> all(q.begin(), q.end());
    for (Req* r : all) {
      remove_queued(r);
      if (r->started) {
        for (size_t i = 0; i < r->ch.size(); ++i)
          if (!r->ch[i].done) finish_choice(r, int(i), FinishReason::Cancelled, -1, out);
      } else {
        reject_locked(r, why, now, out);
      }
    }
  }
  for (Req* r : std::vector<Req*>(running_))
    for (size_t i = 0; i < r->ch.size(); ++i)
      if (!r->ended && !r->ch[i].done) finish_choice(r, int(i), FinishReason::Cancelled, -1, out);
  cancels_.clear();
}

SchedStats Scheduler::stats(double now) const {
  std::lock_guard lk(mu_);
  SchedStats s = st_;
  s.running_requests = int(running_.size());
  s.running_seqs = running_seqs();
  for (int k = 0; k < kNumSloClasses; ++k) s.queued[size_t(k)] = int(queue_[size_t(k)].size());
  s.promised_blocks = promised_blocks();
  s.drain_blocks_per_s = drain_.rate(now);
  s.tokens_per_s = tok_rate_.rate();
  return s;
}

std::array<int64_t, kNumRejectReasons> Scheduler::rejections() const {
  std::lock_guard lk(mu_);
  return st_.rejections;
}

int64_t Scheduler::submitted() const {
  std::lock_guard lk(mu_);
  return st_.submitted;
}

void Scheduler::check_invariants() const {
  std::lock_guard lk(mu_);
  exec_.kv().check_invariants();
  auto fail = [](const std::string& m) { throw std::logic_error("scheduler invariant: " + m); };
  if (cfg_.worst_case_reservation && promised_blocks() > lim_.total - lim_.headroom)
    fail("promised " + std::to_string(promised_blocks()) + " blocks > total " + std::to_string(lim_.total) +
         " - headroom " + std::to_string(lim_.headroom));
  int queued = 0;
  for (const auto& q : queue_) queued += int(q.size());
  if (queued > cfg_.max_queue) fail("queue holds " + std::to_string(queued) + " > --max-queue");
  if (running_seqs() > cfg_.max_seqs) fail("more sequences running than --max-seqs");
  size_t resident = 0;
  for (const Req* r : running_)
    for (const Choice& c : r->ch) {
      resident += c.seq >= 0;
      if (c.seq >= 0 && exec_.kv().num_tokens(c.seq) > int(c.ctx.size())) fail("a sequence is ahead of its context");
      if (c.n_gen > r->max_tokens) fail("a choice generated past max_tokens");
    }
  if (resident != exec_.kv().sequences().size()) fail("KV sequences that no running request owns");
  if (queued + running_.size() != reqs_.size()) fail("requests neither queued nor running");
  std::unordered_map<std::string, int64_t> tb;
  for (const auto& [id, r] : reqs_) tb[r->r.tenant] += r->footprint;
  for (const auto& [t, b] : tb) {
    auto it = tenant_blocks_.find(t);
    if (it == tenant_blocks_.end() || it->second != b) fail("tenant ledger out of step");
  }
}

}  // namespace kvs::sched
