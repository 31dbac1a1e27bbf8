// schedule(): the planning phase of a step, under mu_. Everything here reads
// and changes scheduler state and the KV manager's tables; nothing runs the
// model. The result is a StepPlan of plain slices (their token ids copied).
#include <algorithm>
#include <cmath>
#include <utility>

#include "kv/capacity.h"
#include "sched/scheduler.h"
#include "sched/scheduler_internal.h"

namespace kvs::sched {

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
// each pending fork its private tail. With several KV tables (the hybrid
// cache) every count is per table, each bounded by its window, summed
// (KvManager::bounded, horizon_blocks).
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
      sum += cfg_.worst_case_reservation ? kv.bounded(blocks_for_tokens(full, bs_) - P / bs_) : 1;
    }
  }
  return sum;
}

int64_t Scheduler::promised_blocks() const {
  int64_t p = exec_.kv().used_blocks();
  for (const Req* r : running_) p += outstanding(*r);
  return p;
}

// Upper bound on how much admitting `r` raises promised_blocks(): per
// choice to add, its blocks past the cached prefix (request_blocks, in
// every table), the cached hits that leave the LRU and become pinned, and
// one copy per table when the whole context is cached (its last block is
// recomputed into a copy).
int64_t Scheduler::admission_cost(const Req& r) const {
  const KvManager& kv = exec_.kv();
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
      cost += cfg_.worst_case_reservation ? kv.bounded(blocks_for_tokens(full, bs_) - P / bs_) : 1;
      continue;
    }
    const int64_t len = int64_t(c.ctx.size());
    const KvManager::PrefixProbe hit = kv.probe_prefix(c.ctx, scope);
    const int64_t horizon = cfg_.worst_case_reservation ? full : len + 1;
    cost += hit.revived + kv.bounded(request_blocks(len, std::max<int64_t>(0, horizon - len), bs_, hit.hits)) +
            (hit.hits * bs_ == len ? kv.n_tables() : 0);
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
  auto it = std::find(q.begin(), q.end(), r);
  if (it != q.end()) q.erase(it);  // (fail_all also meets requests between queue and running)
}

// Back into its class queue at its arrival position: a preempted request
// resumes before anything that arrived after it.
void Scheduler::requeue(Req* r) {
  auto& q = queue_[size_t(r->r.slo)];
  auto at = std::find_if(q.begin(), q.end(), [&](const Req* o) { return o->arrival > r->arrival; });
  q.insert(at, r);
}

void Scheduler::preempt(Req* r, StepPlan& plan) {
  for (Choice& c : r->ch)
    if (c.seq >= 0) release_seq(c);
  r->running = false;
  running_.erase(std::find(running_.begin(), running_.end(), r));
  std::erase_if(plan.slices, [&](const StepPlan::Slice& s) { return s.id == r->id; });
  if (!r->prompt_lp_done) r->prompt_lp.clear();  // the recompute gathers them again
  requeue(r);
  ++st_.preemptions;
  plan.report.preempted.push_back(r->id);
}

// Preempts batch requests (most recently admitted first) until `need` more
// blocks fit under `limit`; does nothing unless that can succeed.
bool Scheduler::make_room(int64_t need, int64_t limit, StepPlan& plan, double now) {
  std::vector<Req*> victims;
  for (Req* r : running_)
    if (effective(*r, now) == SloClass::Batch) victims.push_back(r);
  std::sort(victims.begin(), victims.end(), [](const Req* a, const Req* b) { return a->admit_order > b->admit_order; });
  // Lower bound of what preempting all of them frees: their growth plus the
  // blocks only they hold.
  int64_t freeable = 0;
  for (const Req* r : victims) {
    freeable += outstanding(*r);
    for (const Choice& c : r->ch)
      if (c.seq >= 0) freeable += exec_.kv().exclusive_blocks(c.seq);
  }
  if (promised_blocks() + need - freeable > limit) return false;
  for (Req* v : victims) {
    if (promised_blocks() + need <= limit) break;
    preempt(v, plan);
  }
  return promised_blocks() + need <= limit;
}

// The sampling state of a request, made at its first admission.
Scheduler::Draws& Scheduler::draws_of(const Req& r) {
  std::unique_ptr<Draws>& d = draws_[r.id];
  if (d) return *d;
  d = std::make_unique<Draws>();
  d->logprobs = r.r.logprobs;
  d->top_logprobs = r.r.top_logprobs;
  d->counts = r.r.sampling.presence_penalty != 0 || r.r.sampling.frequency_penalty != 0;
  if (r.r.min_tokens > 0) {
    if (!r.r.ignore_eos) d->banned = eog_ids_;
    d->banned.insert(d->banned.end(), r.r.stop_token_ids.begin(), r.r.stop_token_ids.end());
  }
  std::shared_ptr<grammar::StackArena> arena;
  if (r.r.grammar) {
    arena = std::make_shared<grammar::StackArena>(r.r.grammar);
    d->masks = std::make_unique<grammar::MaskCache>();
    GrammarVocab& v = vocabs_[r.r.special_text ? 1 : 0];
    if (!v.trie) {  // the first such request: the vocabulary's trie, once
      v.pieces = vocab_pieces_(r.r.special_text);
      v.trie = std::make_unique<grammar::VocabTrie>(v.pieces);
    }
    d->vocab = &v;
  }
  for (size_t i = 0; i < r.ch.size(); ++i) {
    SamplingParams sp = r.r.sampling;
    sp.seed += uint64_t(i);
    std::vector<int> hist;
    if (sp.repeat_penalty != 1.0f) hist.assign(r.r.prompt.begin(), r.r.prompt.end());
    d->ch.push_back({Sampler(sp), std::move(hist), {}, std::nullopt});
    if (arena) d->ch.back().matcher.emplace(arena);  // each choice its own state: forks diverge
  }
  return *d;
}

// A request's sampling state (its grammar's start among it) before it
// leaves the queue: a grammar that cannot even start turns the request
// away as invalid (HTTP 400), and nothing else is touched.
bool Scheduler::grammar_starts(Req* r, double now, std::vector<TokenEvent>& out) {
  if (!r->r.grammar) return true;
  try {
    draws_of(*r);
    return true;
  } catch (const grammar::GrammarError& e) {
    remove_queued(r);
    reject_locked(r, RejectReason::Invalid, now, out, -1, e.what());
    return false;
  }
}

// ctx[from, from + n) of a choice into the plan, as plain data: its ids,
// whether it completes the context (a draw follows), and for choice 0's
// last prompt chunk which choices fork off it and draw from its row.
void Scheduler::add_slice(StepPlan& plan, const Req& r, int ci, int from, int n) const {
  const Choice& c = r.ch[size_t(ci)];
  StepPlan::Slice s;
  s.id = r.id;
  s.choice = ci;
  s.seq = c.seq;
  s.from = from;
  s.n = n;
  s.tokens.assign(c.ctx.begin() + from, c.ctx.begin() + from + n);
  s.decode = n == 1 && from + 1 == int(c.ctx.size()) && c.n_gen > 0;
  s.draws = !c.done && from + n == int(c.ctx.size());
  s.ban_end = c.n_gen < r.r.min_tokens;
  s.all_logits = r.r.prompt_logprobs && !r.prompt_lp_done && ci == 0;
  if (s.all_logits && from + n < int(c.ctx.size())) s.next_token = c.ctx[size_t(from + n)];
  if (s.draws && ci == 0 && c.n_gen == 0 && r.ch.size() > 1)
    for (size_t j = 1; j < r.ch.size(); ++j)
      if (!r.ch[j].done && r.ch[j].n_gen == 0) s.forks.push_back(int(j));
  plan.slices.push_back(std::move(s));
}

void Scheduler::admit(Req* r, int& budget, StepPlan& plan) {
  bool any_gen = false;
  for (const Choice& c : r->ch) any_gen |= c.n_gen > 0;
  const bool first = !r->started;
  draws_of(*r);
  for (size_t i = 0; i < r->ch.size(); ++i) {
    Choice& c = r->ch[i];
    if (c.done) continue;
    if (!any_gen && i > 0) {
      c.fork_pending = true;
      continue;
    }
    // Prompt logprobs need every prompt position's logits: no prefix hit.
    const SeqAdmission a = exec_.add(c.ctx, r->r.scope, !(r->r.prompt_logprobs && !r->prompt_lp_done));
    c.seq = a.seq;
    c.have = a.cached_tokens;
    if (first && i == 0) {
      r->cached_tokens = a.cached_tokens;
      r->imported_tokens = a.imported_tokens;
    }
    const int n = std::min(int(c.ctx.size()) - a.cached_tokens, budget);
    if (n > 0) {
      add_slice(plan, *r, int(i), a.cached_tokens, n);
      budget -= n;
    }
  }
  if (first) st_.prompt_tokens += int64_t(r->r.prompt.size());
  r->started = true;
  r->running = true;
  r->admit_order = ++admit_counter_;
  running_.push_back(r);
  plan.report.admitted.push_back(r->id);
}

// A handed-over request (disaggregated decode) claims the sequence whose
// prompt K/V a prefill worker sent, instead of prefilling, and feeds the
// first token that worker sampled: from the next step it decodes as if it
// had prefilled here. Its sampler skips the draws the prefill side made.
void Scheduler::admit_handover(Req* r, StepPlan& plan, std::vector<TokenEvent>& out) {
  Choice& c = r->ch[0];
  const Handover& h = *r->r.handover;
  HandoverPort* port = exec_.handover();
  const SeqId seq = port ? port->claim(h.handle, c.ctx, r->r.scope) : -1;
  if (seq < 0) {
    // The client's handle is stale or not for this prompt: a request fault
    // (4xx), not the engine's (a 5xx would page whoever watches errors).
    ++st_.failed;
    finish_choice(r, 0, FinishReason::Rejected, -1, out);
    out.back().reject_reason = RejectReason::Invalid;
    out.back().message = "the handed-over KV cache is gone (unknown or expired transfer handle, freed as unclaimed, or "
                         "another prompt); send the request to the prefill worker again";
    return;
  }
  c.seq = seq;
  c.have = int(c.ctx.size());
  draws_of(*r).ch[0].sampler.advance(h.draws);
  st_.prompt_tokens += int64_t(r->r.prompt.size());
  r->started = true;
  r->running = true;
  r->admit_order = ++admit_counter_;
  running_.push_back(r);
  plan.report.admitted.push_back(r->id);
  Sampled s;
  s.id = r->id;
  s.token = h.first_token;
  apply_sample(r, 0, s, out);
}

// The head waits while a lower tier stages its prefix (it would otherwise
// recompute what is being read), but never longer than tier_wait_s.
bool Scheduler::awaits_tier(Req& h, double now) {
  if (!h.tier_issuing && h.tier_ticket == 0) return false;
  const TierPort* tier = exec_.tier();
  const bool busy = h.tier_issuing || (tier && tier->prefetch_pending(h.tier_ticket));
  if (busy && now - h.arrival < cfg_.tier_wait_s) return true;
  if (h.tier_ticket && tier) h.tier_load_ms = std::max(0.0, tier->prefetch_seconds(h.tier_ticket)) * 1e3;
  h.tier_ticket = 0;
  h.tier_issuing = false;
  return false;
}

// Cancellations free their blocks before anything is planned.
void Scheduler::take_cancels(std::vector<TokenEvent>& out) {
  for (RequestId id : std::vector<RequestId>(cancels_.begin(), cancels_.end())) {
    auto it = reqs_.find(id);
    if (it == reqs_.end()) continue;
    Req* r = it->second.get();
    if (!r->running) remove_queued(r);
    for (size_t i = 0; i < r->ch.size(); ++i)
      if (!r->ch[i].done) finish_choice(r, int(i), FinishReason::Cancelled, -1, out);
  }
  cancels_.clear();
}

// Requests that never ran and cannot have their first token within their
// class's wait limit (the prompt tokens ahead of them and their own, at the
// measured rate) are rejected now, not when the limit passes: a burst gets
// its 429s at once, each with a Retry-After that holds. A preempted request
// has already streamed tokens and is never rejected.
void Scheduler::expire_queued(double now, std::vector<TokenEvent>& out) {
  int64_t queued = 0;  // queued prompt tokens ahead: of more urgent classes, then earlier in this one
  for (int k = 0; k < kNumSloClasses; ++k) {
    std::vector<std::pair<Req*, double>> expired;  // with its Retry-After (< 0: from the drain rate)
    const double wait = cfg_.wait_limit_s[size_t(k)];
    const int64_t running = running_prefill_tokens(SloClass(k), now);
    for (Req* r : queue_[size_t(k)]) {
      const int64_t ahead = running + queued;
      if (r->started) {
        queued += int64_t(r->ch[0].ctx.size());
        continue;
      }
      if (too_late(ahead, r->est_tokens, SloClass(k), now - r->arrival)) {
        const int64_t booked = ledger_.booked_before(INFINITY);
        expired.push_back({r, time_retry_after(ahead + booked, r->est_tokens, SloClass(k), r->fingerprint, now)});
      } else if (now > r->arrival + wait) {
        expired.push_back({r, -1.0});
      } else {
        queued += r->est_tokens;
      }
    }
    for (auto [r, retry] : expired) {
      remove_queued(r);
      reject_locked(r, RejectReason::QueueTimeout, now, out, retry);
    }
  }
}

// Decodes (cls empty), or the prefill chunks of running choices whose
// request's effective class is `*cls`; more urgent classes first, then in
// admission order.
void Scheduler::plan_running(StepPlan& plan, int& budget, double now, std::optional<SloClass> cls) {
  std::vector<Req*> order = running_;
  std::stable_sort(order.begin(), order.end(), [&](const Req* a, const Req* b) {
    const SloClass ea = effective(*a, now), eb = effective(*b, now);
    return ea != eb ? ea < eb : a->admit_order < b->admit_order;
  });
  for (Req* r : order) {
    if (cls && effective(*r, now) != *cls) continue;
    for (size_t i = 0; i < r->ch.size(); ++i) {
      const Choice& c = r->ch[i];
      if (c.seq < 0 || budget <= 0) continue;
      const int rem = int(c.ctx.size()) - c.have;
      if (!cls && rem == 1) {
        add_slice(plan, *r, int(i), c.have, 1);
        --budget;
      } else if (cls && rem > 1) {
        const int n = std::min(rem, budget);
        add_slice(plan, *r, int(i), c.have, n);
        budget -= n;
      }
    }
  }
}

// Prompt tokens the plan sends through the model so far (decodes excluded,
// by the same test update() counts them with).
static int planned_prefill(const StepPlan& plan) {
  int n = 0;
  for (const StepPlan::Slice& s : plan.slices) n += s.decode ? 0 : s.n;
  return n;
}

// Admissions of class `cls`: strict priority, the head is never bypassed.
void Scheduler::admit_queued(StepPlan& plan, int& budget, double now, std::vector<TokenEvent>& out,
                             SloClass cls) {
  while (budget > 0) {
    // No prefill rate yet: admit only until this step can measure one, so a
    // cold burst is not admitted whole on a guess (the next step predicts).
    if (cfg_.rate_sample_tokens > 0 && tok_rate_.rate() <= 0 && planned_prefill(plan) >= cold_sample_tokens()) break;
    Req* h = queue_head(now);
    // A head of another class: a more urgent one was already tried this step
    // and is held for a reason that still holds; a less urgent one waits for
    // the next call.
    if (!h || effective(*h, now) != cls) break;
    int new_seqs = 0;
    for (const Choice& c : h->ch) new_seqs += !c.done;
    if (running_seqs() + new_seqs > admit_seqs()) break;
    const SloClass eff = effective(*h, now);
    const int64_t cost = admission_cost(*h);
    const int64_t limit = lim_.limit(eff);
    if (promised_blocks() + cost > limit) {
      if (eff != SloClass::Interactive || !make_room(cost, limit, plan, now)) break;
      // Preempted requests were re-queued: re-plan the budget they held.
      budget = batch_tokens();
      for (const StepPlan::Slice& s : plan.slices) budget -= s.n;
      if (budget <= 0) break;
    }
    if (awaits_tier(*h, now)) {
      ++st_.tier_waits;
      break;
    }
    const bool handover = h->r.handover && !h->started;  // preempted later: it recomputes like any other
    if (!handover && awaits_inflight_prefix(*h)) {
      ++st_.prefix_waits;
      break;
    }
    if (!grammar_starts(h, now, out)) continue;  // turned away: the next head
    remove_queued(h);
    if (handover) admit_handover(h, plan, out);
    else admit(h, budget, plan);
  }
}

// Requests still waiting after this step's admissions count against
// --max-queue; the newest that do not fit are turned away (with
// --max-queue 0 a request is admitted at the first step after its arrival
// or not at all).
void Scheduler::trim_queue(double now, std::vector<TokenEvent>& out) {
  int waiting = 0;
  for (const auto& q : queue_) waiting += int(q.size());
  for (int k = kNumSloClasses - 1; k >= 0 && waiting > cfg_.max_queue; --k) {
    auto& q = queue_[size_t(k)];
    for (size_t i = q.size(); i-- > 0 && waiting > cfg_.max_queue;) {
      Req* r = q[i];
      if (r->started) continue;  // preempted: it has streamed tokens, it resumes
      q.erase(q.begin() + std::ptrdiff_t(i));
      reject_locked(r, RejectReason::QueueFull, now, out);
      --waiting;
    }
  }
  for (const auto& q : queue_)
    for (Req* r : q) r->seen = true;
}

StepPlan Scheduler::schedule(double now, std::vector<TokenEvent>& out, bool admissions) {
  StepPlan plan;
  ended_.clear();
  ledger_.expire(now);
  take_cancels(out);
  expire_queued(now, out);
  // Decodes first; then interactive prefill, running before newly admitted;
  // then batch prefill. A waiting interactive request so takes the step's
  // budget from a batch prompt being prefilled (chunked prefill resumes it
  // the next step), not only what the batch prompt left over.
  int budget = batch_tokens();
  plan_running(plan, budget, now, std::nullopt);
  plan_running(plan, budget, now, SloClass::Interactive);
  if (admissions) admit_queued(plan, budget, now, out, SloClass::Interactive);
  plan_running(plan, budget, now, SloClass::Batch);
  if (admissions) admit_queued(plan, budget, now, out, SloClass::Batch);
  trim_queue(now, out);
  return plan;
}

}  // namespace kvs::sched
