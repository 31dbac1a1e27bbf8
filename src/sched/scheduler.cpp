#include "sched/scheduler.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <optional>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "kv/capacity.h"
#include "sched/scheduler_internal.h"
#include "sched/token_budget.h"
#include "tokenizer/vocab.h"

namespace kvs::sched {

Scheduler::Scheduler(StepExecutor& exec, const SchedulerConfig& cfg, std::function<bool(int32_t)> is_eog,
                     std::function<void(const std::string&)> log)
    : exec_(exec),
      cfg_(cfg),
      lim_(pool_limits(exec.kv().total_blocks(), cfg)),
      bs_(exec.kv().block_size()),
      is_eog_(std::move(is_eog)),
      log_(std::move(log)),
      drain_(cfg.drain_halflife_s),
      tok_rate_(cfg.drain_halflife_s) {
  if (cfg.max_batch_tokens < 1) throw std::invalid_argument("--max-batch-tokens must be >= 1");
  if (cfg.max_seqs < 1) throw std::invalid_argument("--max-seqs must be >= 1");
  if (cfg.max_queue < 0) throw std::invalid_argument("--max-queue must be >= 0");
  if (cfg.default_max_tokens < 1) throw std::invalid_argument("default max_tokens must be >= 1");
  if (!(cfg.ttft_margin > 0 && cfg.ttft_margin <= 1)) throw std::invalid_argument("ttft_margin must be in (0, 1]");
  st_.total_blocks = lim_.total;
  st_.headroom_blocks = lim_.headroom;
  if (is_eog_)
    for (int32_t t = 0; t < exec.n_vocab(); ++t)
      if (is_eog_(t)) eog_ids_.push_back(t);
}

Scheduler::~Scheduler() = default;

std::string Scheduler::log_fields(const Request& req, int64_t need) const {
  return "class=" + std::string(to_string(req.slo)) + " tenant=" + (req.tenant.empty() ? std::string("-") : req.tenant) +
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

// mu_ held.
void Scheduler::count_rejection(RejectReason why, const Request& req, int64_t need, double now) {
  rejections_[size_t(why)].fetch_add(1, std::memory_order_relaxed);
  if (recent_rejects_.size() >= kRecentRejects) recent_rejects_.pop_front();
  recent_rejects_.push_back({now, why, req.slo, req.tenant, need});
}

SubmitResult Scheduler::reject_submit(const Request& req, int64_t need, RejectReason why, std::string msg,
                                      double now, std::string param) {
  SubmitResult res;
  res.id = req.id;
  res.reason = why;
  res.need_blocks = need;
  res.message = std::move(msg);
  res.param = std::move(param);
  if (retryable(why)) res.retry_after_s = retry_estimate(need, req.slo, now);
  count_rejection(why, req, need, now);
  return res;
}

static void log_reject(const std::function<void(const std::string&)>& log, RejectReason why,
                       const std::string& fields, double retry_after_s) {
  if (!log) return;
  char ra[32];
  std::snprintf(ra, sizeof ra, "%.0f", retry_after_s);
  log("reject reason=" + std::string(to_string(why)) + " " + fields + " retry_after_s=" + ra);
}

// mu_ held. What makes a request invalid whatever the load (message ""
// when nothing), named by the OpenAI field that carries it.
Scheduler::FieldError Scheduler::invalid_fields(const Request& req) const {
  const int nv = exec_.n_vocab();
  if (req.prompt.empty()) return {"the prompt has no tokens", "prompt"};
  if (std::string e = token_ids_error(req.prompt, nv, "prompt"); !e.empty()) return {e, "prompt"};
  if (req.n < 1 || req.n > cfg_.max_seqs) return {"n must be between 1 and " + std::to_string(cfg_.max_seqs), "n"};
  if ((req.hand_off || req.handover) && req.prompt_logprobs)
    return {"prompt logprobs (echo with logprobs) are not computed across a KV hand-over", "echo"};
  // The first token is sampled on the prefill side and only its id crosses:
  // a decode worker's logprobs would lack it, and every offset with it.
  if ((req.hand_off || req.handover) && req.logprobs)
    return {"logprobs are not carried across a prefill/decode hand-over (the first token's would be missing); "
            "send the request to a worker that serves both roles",
            "logprobs"};
  if ((req.hand_off || req.handover) && req.n != 1)
    return {"a request handed between prefill and decode workers must have n = 1", "n"};
  if (req.handover)
    if (std::string e = token_ids_error({&req.handover->first_token, 1}, nv, "the handed-over first"); !e.empty())
      return {e, ""};
  if (req.top_logprobs < 0 || req.top_logprobs > 20) return {"top_logprobs must be between 0 and 20", "top_logprobs"};
  if (std::string e = token_ids_error(req.stop_token_ids, nv, "stop_token_ids:"); !e.empty())
    return {e, "stop_token_ids"};
  for (const auto& [id, bias] : req.sampling.logit_bias)
    if (!token_in_vocab(id, nv))
      return {"logit_bias token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(nv) +
                  " tokens",
              "logit_bias"};
  if (req.min_tokens < 0) return {"min_tokens must be >= 0", "min_tokens"};
  if (req.grammar && !vocab_pieces_) return {"constrained decoding needs the model's vocabulary (none is loaded)", ""};
  if (req.id != 0 && reqs_.count(req.id)) return {"request id " + std::to_string(req.id) + " is in use", ""};
  return {};
}

// mu_ held. Every reason to turn a request away at submit, cheapest first.
SubmitCheck Scheduler::check_submit(const Request& req, double now) {
  SubmitCheck c;
  const int max_ctx = exec_.max_ctx();
  const int64_t P = int64_t(req.prompt.size());
  auto reject = [&](RejectReason why, const std::string& m, const std::string& param = {}) {
    c.res = reject_submit(req, c.need, why, m, now, param);
    return c;
  };
  if (!accepting_) return reject(RejectReason::ShuttingDown, "the server is shutting down");
  if (shed_.stop_admissions) {
    reject(RejectReason::DeviceBusy, "the device is under memory or thermal strain; no new requests for now");
    // The device, not the pool, decides when this can succeed.
    if (shed_.retry_after_s > 0) c.res.retry_after_s = shed_.retry_after_s;
    return c;
  }
  if (FieldError e = invalid_fields(req); !e.message.empty()) return reject(RejectReason::Invalid, e.message, e.param);
  const TokenBudget budget = token_budget(P, req.max_tokens, max_ctx, cfg_.default_max_tokens);
  if (!budget.ok())
    return budget.context_length ? reject(RejectReason::ContextLength, budget.error)
                                 : reject(RejectReason::Invalid, budget.error, "max_tokens");
  // max_tokens is a hard stop; device shedding may shorten it.
  const int asked = budget.max_tokens;
  if (req.min_tokens > asked)
    return reject(RejectReason::Invalid,
                  "min_tokens (" + std::to_string(req.min_tokens) + ") exceeds max_tokens (" + std::to_string(asked) + ")",
                  "min_tokens");
  c.max_tokens = shed_.max_tokens_scale < 1 ? std::max(1, int(double(asked) * shed_.max_tokens_scale)) : asked;
  // Per KV table: under a bounding window no choice ever holds more than
  // that table's cap (KvManager::bounded; immutable, so any thread may ask).
  c.need = exec_.kv().bounded(request_footprint(P, c.max_tokens, req.n, bs_), req.n);
  if (c.need > lim_.request_cap)
    return reject(RejectReason::RequestShare,
                  "request needs up to " + std::to_string(c.need) + " KV blocks (" + std::to_string(P) +
                      " prompt + " + std::to_string(c.max_tokens) + " new tokens, n=" + std::to_string(req.n) +
                      "); one request may use at most " + std::to_string(lim_.request_cap) + " of " +
                      std::to_string(lim_.total));
  // --max-queue bounds the requests that wait past the next step (trim_queue
  // enforces it there). Here: the ones that already waited a step, and all
  // of them against the bound plus the sequences the next step could start.
  int waited = 0, queued = 0;
  for (const auto& q : queue_)
    for (const Req* r : q) {
      ++queued;
      waited += r->seen;
    }
  if (waited >= std::max(1, cfg_.max_queue) || queued >= cfg_.max_queue + std::max(0, cfg_.max_seqs - running_seqs()))
    return reject(RejectReason::QueueFull, cfg_.max_queue == 0
                                                ? std::string("no request may wait (--max-queue 0) and the engine is busy")
                                                : "the queue is full (" + std::to_string(queued) + " requests waiting)");
  const auto tb = tenant_blocks_.find(req.tenant);
  const int64_t held = tb == tenant_blocks_.end() ? 0 : tb->second;
  if (held + c.need > lim_.tenant_quota) {
    reject(RejectReason::TenantQuota, "tenant quota: " + std::to_string(held) + " blocks in use or queued + " +
                                          std::to_string(c.need) + " requested > quota " +
                                          std::to_string(lim_.tenant_quota));
    // The tenant's own work must drain first: estimate from its excess.
    c.res.retry_after_s = retry_after_s(held + c.need - lim_.tenant_quota, drain_.rate(now), cfg_);
    return c;
  }
  // A request whose first token would come after its class's wait limit is
  // told so now, with the time at which it would not (a burst of long
  // prompts on a busy engine).
  c.est_tokens = req.handover ? 1 : estimate_tokens(req);  // a handover's prompt is already computed
  c.fingerprint = request_fingerprint(req.scope, req.tenant, req.prompt);
  ledger_.expire(now);
  const std::optional<double> told = ledger_.redeem(c.fingerprint);
  const int64_t ahead = tokens_ahead(req.slo, now) + ledger_.booked_before(told ? *told : INFINITY);
  if (too_late(ahead, c.est_tokens, req.slo, 0)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "the engine is busy: the first token would take about %.0f s (%s requests wait at most %.0f s)",
                  predicted_ttft_s(ahead, c.est_tokens), to_string(req.slo), cfg_.wait_limit_s[size_t(req.slo)]);
    reject(RejectReason::QueueTimeout, buf);
    c.res.retry_after_s = time_retry_after(ahead, c.est_tokens, req.slo, c.fingerprint, now);
    return c;
  }
  c.res.accepted = true;
  c.res.need_blocks = c.need;
  return c;
}

SubmitResult Scheduler::submit(Request req, double now) {
  submitted_.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock lk(mu_);
  SubmitCheck chk = check_submit(req, now);
  const int64_t need = chk.need;
  if (!chk.res.accepted) {
    log_reject(log_, chk.res.reason, log_fields(req, need), chk.res.retry_after_s);
    return chk.res;
  }
  SubmitResult res = chk.res;
  auto q = std::make_unique<Req>();
  if (req.id == 0) {
    while (reqs_.count(next_id_)) ++next_id_;
    req.id = next_id_++;
  }
  q->id = req.id;
  q->max_tokens = chk.max_tokens;
  q->footprint = need;
  q->est_tokens = chk.est_tokens;
  q->fingerprint = chk.fingerprint;
  q->arrival = now;
  q->ch.resize(size_t(req.n));
  for (Choice& c : q->ch) c.ctx = req.prompt;  // samplers: at the first admission (engine thread)
  req.sink = nullptr;  // events leave through the engine loop, not the scheduler
  q->r = std::move(req);
  q->tier_issuing = exec_.tier() && !q->r.handover;
  tenant_blocks_[q->r.tenant] += need;
  res.id = q->id;
  queue_[size_t(q->r.slo)].push_back(q.get());
  const Req* queued = q.get();
  reqs_.emplace(q->id, std::move(q));
  n_reqs_.store(reqs_.size(), std::memory_order_release);
  if (queued->tier_issuing) issue_tier_fetch(lk, res.id);
  return res;
}

// The tier fetch hashes the prompt and may take the tier's own lock: not
// under mu_. The request waits at the queue head until its ticket is set.
void Scheduler::issue_tier_fetch(std::unique_lock<RankedMutex>& lk, RequestId id) {
  auto it = reqs_.find(id);
  const std::vector<int32_t> prompt = it->second->r.prompt;
  const Scope scope = it->second->r.scope;
  const double retention = it->second->r.retention_s;
  lk.unlock();
  uint64_t ticket = 0;
  try {
    ticket = exec_.tier()->prefetch(prompt, scope, retention);
  } catch (const std::exception&) {
    ticket = 0;  // the tier is an optimisation: the request recomputes
  }
  lk.lock();
  it = reqs_.find(id);
  if (it == reqs_.end()) return;
  it->second->tier_ticket = ticket;
  it->second->tier_issuing = false;
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

void Scheduler::set_shed(const ShedLimits& s) {
  std::lock_guard lk(mu_);
  shed_ = s;
}

ShedLimits Scheduler::shed() const {
  std::lock_guard lk(mu_);
  return shed_;
}

int Scheduler::batch_tokens() const {
  if (shed_.batch_scale >= 1) return cfg_.max_batch_tokens;
  return std::max(1, int(double(cfg_.max_batch_tokens) * shed_.batch_scale));
}

int Scheduler::admit_seqs() const {
  if (shed_.batch_scale >= 1) return cfg_.max_seqs;
  return std::max(1, int(double(cfg_.max_seqs) * shed_.batch_scale));
}

void Scheduler::reject_locked(Req* r, RejectReason why, double now, std::vector<TokenEvent>& out,
                              double retry_after, const std::string& message) {
  const double ra = !retryable(why) ? 0 : retry_after >= 0 ? retry_after : retry_estimate(r->footprint, r->r.slo, now);
  count_rejection(why, r->r, r->footprint, now);
  log_reject(log_, why, log_fields(r->r, r->footprint), ra);
  std::string msg = "the server is shutting down";
  if (why == RejectReason::QueueTimeout)
    msg = "not admitted within the " + std::string(to_string(r->r.slo)) + " wait limit; retry later";
  else if (why == RejectReason::QueueFull)
    msg = cfg_.max_queue == 0 ? "no request may wait (--max-queue 0) and the engine was busy"
                              : "the queue is full (--max-queue " + std::to_string(cfg_.max_queue) + ")";
  if (!message.empty()) msg = message;
  for (size_t i = 0; i < r->ch.size(); ++i) {
    TokenEvent e;
    e.request = r->id;
    e.choice = int(i);
    e.finish = FinishReason::Rejected;
    e.reject_reason = why;
    e.retry_after_s = ra;
    e.message = msg;
    e.usage.prompt_tokens = int(r->r.prompt.size());
    out.push_back(std::move(e));
    r->ch[i].done = true;
  }
  end_request(r);
}

void Scheduler::release_seq(Choice& c) {
  const int32_t before = exec_.kv().available_blocks();
  exec_.release(c.seq);
  freed_this_step_ += exec_.kv().available_blocks() - before;
  c.seq = -1;
  c.have = 0;
}

// mu_ held. The request leaves every structure; its Req is destroyed.
void Scheduler::end_request(Req* r) {
  for (Choice& c : r->ch)
    if (c.seq >= 0) release_seq(c);
  if (r->running) running_.erase(std::find(running_.begin(), running_.end(), r));
  r->running = false;
  r->ended = true;
  auto it = tenant_blocks_.find(r->r.tenant);
  if (it != tenant_blocks_.end() && (it->second -= r->footprint) <= 0) tenant_blocks_.erase(it);
  cancels_.erase(r->id);
  auto node = reqs_.find(r->id);
  ended_.push_back(std::move(node->second));
  reqs_.erase(node);
  n_reqs_.store(reqs_.size(), std::memory_order_release);
  draws_.erase(r->id);
}

Usage Scheduler::usage(RequestId id) const {
  std::lock_guard lk(mu_);
  auto it = reqs_.find(id);
  Usage u;
  if (it == reqs_.end()) return u;
  const Req& r = *it->second;
  u.prompt_tokens = int(r.r.prompt.size());
  u.cached_tokens = r.cached_tokens;
  u.tier_tokens = r.imported_tokens;
  u.tier_load_ms = r.tier_load_ms;
  for (const Choice& c : r.ch) u.completion_tokens += c.n_gen;
  return u;
}

// mu_ held. Ends one choice with a final event (token -1 when none).
void Scheduler::finish_choice(Req* r, int ci, FinishReason why, int32_t token, std::vector<TokenEvent>& out) {
  Choice& c = r->ch[size_t(ci)];
  if (c.seq >= 0) release_seq(c);
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
  e.usage.tier_tokens = r->imported_tokens;
  e.usage.tier_load_ms = r->tier_load_ms;
  for (const Choice& o : r->ch) e.usage.completion_tokens += o.n_gen;
  if (why == FinishReason::Cancelled) ++st_.cancelled;
  if (why == FinishReason::Error) e.message = "the engine failed while running this request";
  if (last) {
    ++st_.finished;
    end_request(r);
  }
}

void Scheduler::end_choice(RequestId id, int choice) {
  std::lock_guard lk(mu_);
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return;
  Req* r = it->second.get();
  Choice& c = r->ch.at(size_t(choice));
  if (c.done) return;
  if (c.seq >= 0) release_seq(c);
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

// Ends every queued and running request with an error (the engine loop's
// last resort when a step keeps failing outside the forward).
void Scheduler::fail_all(const std::string& message, std::vector<TokenEvent>& out) {
  std::lock_guard lk(mu_);
  std::vector<Req*> all;
  for (auto& [id, r] : reqs_) all.push_back(r.get());
  for (Req* r : all) {
    if (!r->running) remove_queued(r);
    ++st_.failed;
    for (size_t i = 0; i < r->ch.size() && !r->ended; ++i)
      if (!r->ch[i].done) {
        finish_choice(r, int(i), FinishReason::Error, -1, out);
        out.back().message = message;
      }
  }
  cancels_.clear();
}

// The three phases; a plan that found too few free blocks preempted one
// request in update() and is made again (without admissions), so a step
// always ends with a forward, an error, or nothing left to run.
StepReport Scheduler::step(double now, std::vector<TokenEvent>& out) {
  {
    std::lock_guard lk(mu_);
    // The previous step's tokens over its duration (busy steps only).
    if (last_step_tokens_ > 0 && now > last_step_at_) tok_rate_.add(last_step_tokens_, now - last_step_at_);
    last_step_tokens_ = 0;
    last_step_at_ = now;
  }
  StepReport rep;
  for (bool first = true;; first = false) {
    StepPlan plan;
    {
      std::lock_guard lk(mu_);
      plan = schedule(now, out, first);
    }
    StepOutput res;
    try {
      res = execute(plan);
    } catch (const std::exception& ex) {
      res = StepOutput{};
      res.error = ex.what();
      if (res.error.empty()) res.error = "unknown error";
    }
    bool again;
    {
      std::lock_guard lk(mu_);
      again = update(plan, res, now, out);
    }
    const StepReport& r = plan.report;
    rep.decode_tokens += r.decode_tokens;
    rep.prefill_tokens += r.prefill_tokens;
    rep.seqs += r.seqs;
    rep.admitted.insert(rep.admitted.end(), r.admitted.begin(), r.admitted.end());
    rep.preempted.insert(rep.preempted.end(), r.preempted.begin(), r.preempted.end());
    if (!again) return rep;
  }
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
  s.rejections = rejections();
  s.submitted = submitted();
  s.tenant_blocks.assign(tenant_blocks_.begin(), tenant_blocks_.end());
  s.tenant_quota = lim_.tenant_quota;
  s.recent_rejects.assign(recent_rejects_.begin(), recent_rejects_.end());
  return s;
}

std::array<int64_t, kNumRejectReasons> Scheduler::rejections() const {
  std::array<int64_t, kNumRejectReasons> r{};
  for (size_t i = 0; i < r.size(); ++i) r[i] = rejections_[i].load(std::memory_order_relaxed);
  return r;
}

void Scheduler::check_invariants() const {
  std::lock_guard lk(mu_);
  exec_.kv().check_invariants();
  auto fail = [](const std::string& m) { throw std::logic_error("scheduler invariant: " + m); };
  if (cfg_.worst_case_reservation && promised_blocks() > lim_.total - lim_.headroom)
    fail("promised " + std::to_string(promised_blocks()) + " blocks > total " + std::to_string(lim_.total) +
         " - headroom " + std::to_string(lim_.headroom));
  int queued = 0, waited = 0;
  for (const auto& q : queue_)
    for (const Req* r : q) {
      ++queued;
      waited += r->seen && !r->started;
    }
  if (waited > cfg_.max_queue) fail("queue holds " + std::to_string(waited) + " waiting requests > --max-queue");
  if (running_seqs() > cfg_.max_seqs) fail("more sequences running than --max-seqs");
  size_t resident = 0;
  for (const Req* r : running_)
    for (const Choice& c : r->ch) {
      resident += c.seq >= 0;
      if (c.seq >= 0 && exec_.kv().num_tokens(c.seq) > int(c.ctx.size())) fail("a sequence is ahead of its context");
      if (c.seq >= 0 && exec_.kv().num_tokens(c.seq) != c.have) fail("a choice's cached-token count is out of step");
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
