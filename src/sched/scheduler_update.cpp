// execute() and update(): the forward over a StepPlan without the lock,
// drawing from the logits rows (still without it: the samplers are the
// engine thread's alone), then the bookkeeping under mu_.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <mutex>

#include "sched/scheduler.h"
#include "sched/scheduler_internal.h"

namespace kvs::sched {

namespace {

void log_softmax_row(const float* x, int n, std::vector<float>& out) {
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const float lse = float(mx + std::log(sum));
  out.resize(size_t(n));
  for (int i = 0; i < n; ++i) out[size_t(i)] = x[i] - lse;
}

// The sampled token's log-probability and the k best alternatives.
void fill_logprobs(const float* logits, int nv, int k, Sampled& s) {
  std::vector<float> lp;
  log_softmax_row(logits, nv, lp);
  s.logprob = TokenLogprob{s.token, lp[size_t(s.token)]};
  std::vector<int> idx(static_cast<size_t>(nv));
  for (int i = 0; i < nv; ++i) idx[size_t(i)] = i;
  k = std::min(k, nv);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return lp[size_t(a)] != lp[size_t(b)] ? lp[size_t(a)] > lp[size_t(b)] : a < b;
  });
  for (int i = 0; i < k; ++i) s.top.push_back({idx[size_t(i)], lp[size_t(idx[size_t(i)])]});
}

}  // namespace

// Row i of an all-logits slice is position from + i; it scores the prompt
// token after it: the slice's next one, for its last row the first token of
// the next chunk (none after the prompt's last token: that row draws).
void Scheduler::prompt_logprobs(const StepPlan& plan, size_t item, const StepResult& res, StepOutput& out) {
  const StepPlan::Slice& sl = plan.slices[item];
  const Draws& d = *draws_.at(sl.id);
  for (int i = 0; i < sl.n; ++i) {
    Sampled s;
    s.token = i + 1 < sl.n ? sl.tokens[size_t(i) + 1] : sl.next_token;
    if (s.token < 0) break;
    fill_logprobs(res.logits_of(item, i), res.n_vocab, d.top_logprobs, s);
    out.prompt_lps.push_back({sl.id, PromptLogprob{sl.from + i + 1, s.token, s.logprob->logprob, std::move(s.top)}});
  }
}

// No lock held: the model runs over the plan's own token copies, then each
// choice whose context is now complete draws from its row; a choice 0 that
// just finished its prompt also draws for the choices that will fork off
// it, from the same row. Running out of blocks is a result, not an action:
// update() decides whom to preempt.
StepOutput Scheduler::execute(const StepPlan& plan) {
  StepOutput out;
  if (plan.slices.empty()) return out;
  std::vector<SeqStep> items;
  items.reserve(plan.slices.size());
  for (const StepPlan::Slice& s : plan.slices) items.push_back({s.seq, s.tokens, s.all_logits});
  StepResult res = exec_.step(items);
  if (!res.ok) {
    out.no_room = std::move(res.no_room);
    return out;
  }
  out.ran = true;
  const int nv = res.n_vocab;
  for (size_t k = 0; k < plan.slices.size(); ++k) {
    const StepPlan::Slice& sl = plan.slices[k];
    if (sl.all_logits) prompt_logprobs(plan, k, res, out);
    if (!sl.draws) continue;
    Draws& d = *draws_.at(sl.id);
    const float* row = res.logits_of(k);
    auto draw = [&](int ci, bool forks) {
      Draws::PerChoice& pc = d.ch[size_t(ci)];
      Sampled s;
      s.id = sl.id;
      s.choice = ci;
      s.forks = forks;
      DrawContext ctx;
      ctx.history = &pc.hist;
      if (d.counts) ctx.generated = &pc.counts;
      // Forks have generated as little as choice 0; a grammar that must end
      // now overrides min_tokens.
      if (sl.ban_end && !(pc.matcher && pc.matcher->must_end())) ctx.banned = d.banned;
      std::vector<uint64_t> mask;
      try {
        if (pc.matcher && pc.sampler.params().temperature <= 0) {
          // Greedy: the unconstrained argmax is the constrained one whenever
          // the grammar allows it, so the mask is needed only when it does not.
          s.token = pc.sampler.sample_with(row, nv, ctx);
          if (!grammar_allows(*pc.matcher, s.token, d)) {
            mask = grammar_mask(*pc.matcher, d);
            ctx.allowed = &mask;
            s.token = pc.sampler.sample_with(row, nv, ctx);
          }
        } else {
          if (pc.matcher) {
            mask = grammar_mask(*pc.matcher, d);
            ctx.allowed = &mask;
          }
          s.token = pc.sampler.sample_with(row, nv, ctx);
        }
      } catch (const grammar::GrammarError& e) {  // this choice's grammar alone: the others draw on
        s.error = e.what();
      }
      if (s.error.empty() && (d.logprobs || d.top_logprobs > 0)) fill_logprobs(row, nv, d.top_logprobs, s);
      out.samples.push_back(std::move(s));
    };
    draw(sl.choice, !sl.forks.empty());
    for (int j : sl.forks) draw(j, false);
  }
  return out;
}

// What a choice's first event carries: position 0 (no logprob), then the rest.
static std::vector<PromptLogprob> prompt_lp_of(const Scheduler::Req& r) {
  std::vector<PromptLogprob> v;
  v.reserve(r.prompt_lp.size() + 1);
  v.push_back({0, r.r.prompt.at(0), std::nullopt, {}});
  v.insert(v.end(), r.prompt_lp.begin(), r.prompt_lp.end());
  return v;
}

void Scheduler::apply_sample(Req* r, int ci, const Sampled& s, std::vector<TokenEvent>& out) {
  Choice& c = r->ch[size_t(ci)];
  if (!s.error.empty()) return fail_choice(r, ci, s.error, out);
  if (r->r.hand_off && c.n_gen == 0) {
    hand_off(r, ci, s, out);
    return;
  }
  const bool first = c.n_gen == 0;
  if (first && r->r.prompt_logprobs) r->prompt_lp_done = true;
  const auto& stop_ids = r->r.stop_token_ids;
  if ((is_eog_ && !r->r.ignore_eos && is_eog_(s.token)) ||
      std::find(stop_ids.begin(), stop_ids.end(), s.token) != stop_ids.end()) {
    finish_choice(r, ci, FinishReason::Stop, -1, out);
    if (first && r->r.prompt_logprobs) out.back().prompt_logprobs = prompt_lp_of(*r);
    return;
  }
  Draws& d = draws_of(*r);
  Draws::PerChoice& pc = d.ch[size_t(ci)];
  bool fits = true;
  try {
    fits = !pc.matcher || pc.matcher->accept(d.vocab->pieces.at(size_t(s.token)));
  } catch (const grammar::GrammarError& e) {
    return fail_choice(r, ci, e.what(), out);
  }
  // Only a token from elsewhere (a hand-over's first) can break it.
  if (!fits) return fail_choice(r, ci, "token " + std::to_string(s.token) + " breaks the request's grammar", out);
  TokenEvent e;
  e.request = r->id;
  e.choice = ci;
  e.token = s.token;
  e.logprob = s.logprob;
  e.top_logprobs = s.top;
  if (first && r->r.prompt_logprobs) e.prompt_logprobs = prompt_lp_of(*r);
  out.push_back(std::move(e));
  c.ctx.push_back(s.token);
  if (!pc.hist.empty()) pc.hist.push_back(s.token);
  if (d.counts) ++pc.counts[s.token];
  ++c.n_gen;
  ++st_.generated_tokens;
  if (pc.matcher && pc.matcher->must_end()) finish_choice(r, ci, FinishReason::Stop, s.token, out);  // a whole sentence
  else if (c.n_gen >= r->max_tokens || int(c.ctx.size()) >= exec_.max_ctx())
    finish_choice(r, ci, FinishReason::Length, s.token, out);
}

// One choice ends with an error; the rest of the step goes on.
void Scheduler::fail_choice(Req* r, int ci, const std::string& message, std::vector<TokenEvent>& out) {
  ++st_.failed;
  finish_choice(r, ci, FinishReason::Error, -1, out);
  out.back().message = message;
}

std::vector<uint64_t> Scheduler::grammar_mask(const grammar::Matcher& m, const Draws& d) {
  std::vector<uint64_t> mask = d.masks->get(m, *d.vocab->trie);
  const bool dead = std::all_of(mask.begin(), mask.end(), [](uint64_t w) { return w == 0; });
  // Where the grammar may end, end of generation is allowed too; where no
  // token of this vocabulary continues it, only that is left.
  if (m.can_end() || dead)
    for (int32_t t : eog_ids_) mask[size_t(t) / 64] |= uint64_t(1) << (t % 64);
  return mask;
}

bool Scheduler::grammar_allows(const grammar::Matcher& m, int32_t token, const Draws& d) const {
  if (std::binary_search(eog_ids_.begin(), eog_ids_.end(), token)) return m.can_end();
  const std::string& p = d.vocab->pieces.at(size_t(token));
  if (p.empty()) return false;
  grammar::Matcher c = m;
  return c.accept(p);
}

// A prefill worker's request (Request::hand_off) ends at its first token,
// whatever it is (the decode side judges end of generation and limits), and
// its sequence leaves the scheduler unreleased: the event's holder ships its
// K/V and then releases it.
void Scheduler::hand_off(Req* r, int ci, const Sampled& s, std::vector<TokenEvent>& out) {
  Choice& c = r->ch[size_t(ci)];
  const HandOff h{c.seq, s.token, draws_of(*r).ch[size_t(ci)].sampler.draws()};
  c.seq = -1;
  c.have = 0;
  ++c.n_gen;
  ++st_.generated_tokens;
  finish_choice(r, ci, FinishReason::HandedOff, -1, out);
  out.back().hand_off = h;
}

// The forward threw: its state for these sequences cannot be trusted, so
// exactly the requests of this step end with an error and free their blocks.
void Scheduler::fail_plan(const StepPlan& plan, const std::string& error, std::vector<TokenEvent>& out) {
  std::vector<RequestId> failed;
  for (const StepPlan::Slice& s : plan.slices)
    if (std::find(failed.begin(), failed.end(), s.id) == failed.end()) failed.push_back(s.id);
  for (RequestId id : failed) {
    auto it = reqs_.find(id);
    if (it == reqs_.end()) continue;
    Req* r = it->second.get();
    ++st_.failed;
    for (size_t i = 0; i < r->ch.size() && !r->ended; ++i)
      if (!r->ch[i].done) {
        finish_choice(r, int(i), FinishReason::Error, -1, out);
        out.back().message = "the engine failed while running this request: " + error;
      }
  }
}

// Too few free blocks for the plan (possible only without worst-case
// reservation): the lowest-priority, most recently admitted request gives
// its blocks back and waits in the queue.
void Scheduler::preempt_for_room(StepPlan& plan, double now) {
  Req* victim = nullptr;
  for (Req* r : running_)
    if (!victim || effective(*r, now) > effective(*victim, now) ||
        (effective(*r, now) == effective(*victim, now) && r->admit_order > victim->admit_order))
      victim = r;
  assert(victim);
  if (victim) preempt(victim, plan);
}

bool Scheduler::update(StepPlan& plan, const StepOutput& res, double now, std::vector<TokenEvent>& out) {
  StepReport& rep = plan.report;
  bool again = false;
  if (!res.error.empty()) {
    if (log_) log_("engine step failed: " + res.error + " (" + std::to_string(plan.slices.size()) + " sequences failed)");
    fail_plan(plan, res.error, out);
  } else if (!res.ran && !res.no_room.empty()) {
    preempt_for_room(plan, now);
    again = !running_.empty();
  } else if (res.ran) {
    ++st_.steps;
    for (const StepPlan::Slice& s : plan.slices) {
      reqs_.at(s.id)->ch[size_t(s.choice)].have = s.from + s.n;
      if (s.decode) ++rep.decode_tokens;
      else {
        rep.prefill_tokens += s.n;
        st_.prefill_tokens += s.n;
      }
      ++rep.seqs;
    }
    for (const auto& [id, lp] : res.prompt_lps) reqs_.at(id)->prompt_lp.push_back(lp);
    for (const Sampled& s : res.samples) {
      auto it = reqs_.find(s.id);
      if (it == reqs_.end()) continue;
      Req* r = it->second.get();
      if (r->ended || r->ch[size_t(s.choice)].done) continue;
      if (s.forks) {  // n > 1: the other choices fork off choice 0 once the prompt is in
        const Choice& c0 = r->ch[0];
        for (size_t j = 1; j < r->ch.size(); ++j)
          if (r->ch[j].fork_pending) {
            r->ch[j].fork_pending = false;
            r->ch[j].seq = exec_.fork(c0.seq);
            r->ch[j].have = c0.have;
          }
      }
      apply_sample(r, s.choice, s, out);
    }
  }
  drain_.add(freed_this_step_, now);
  freed_this_step_ = 0;
  promised_published_ = promised_blocks();
  // The prefill rate: steps that were mostly prefill, timed by the next
  // step's start. That follows at once only while work remains (an idle
  // engine thread waits, and that wait is not step time). Decode-only steps
  // are not counted: their few tokens per weight pass would understate how
  // fast queued prompts are served. The first rate may come from a smaller
  // step (cold_sample_tokens): a cold burst must not wait for a full one.
  bool more = !running_.empty();
  for (const auto& q : queue_) more = more || !q.empty();
  const bool cold = cfg_.rate_sample_tokens > 0 && tok_rate_.rate() <= 0 && rep.prefill_tokens >= cold_sample_tokens();
  if (more && (cold || 2 * rep.prefill_tokens >= cfg_.max_batch_tokens))
    last_step_tokens_ = rep.prefill_tokens + rep.decode_tokens;
  return again;
}

}  // namespace kvs::sched
