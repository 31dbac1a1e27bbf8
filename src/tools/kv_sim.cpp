#include "tools/kv_sim.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <random>
#include <stdexcept>

#include "kv/kv_manager.h"

namespace kvs::tools {

const char* to_string(KvSimPolicy p) {
  switch (p) {
    case KvSimPolicy::Paged: return "paged";
    case KvSimPolicy::ReservePromptMax: return "reserve prompt+max_tokens";
    case KvSimPolicy::ReserveMaxContext: return "reserve max context";
  }
  return "?";
}

namespace {

struct Req {
  int prompt = 0;     // tokens to prefill (after a preemption: prompt + generated so far)
  int output = 0;     // tokens still to sample
  int generated = 0;  // sampled since (re)admission
  int max_tokens = 0; // generation limit still open (contiguous reservation)
  SeqId seq = -1;
  int64_t reserved = 0;  // contiguous policies: slots reserved
  int64_t kv_tokens() const { return int64_t(prompt) + generated - 1; }  // the last sample is not in the cache yet
};

void validate(const KvSimConfig& c) {
  auto bad = [](const std::string& s) { throw std::invalid_argument("kv-sim: " + s); };
  if (c.block_size < 1) bad("block size must be >= 1");
  if (c.prompt_min < 1 || c.prompt_max < c.prompt_min) bad("need 1 <= prompt_min <= prompt_max");
  if (c.output_min < 1 || c.output_max < c.output_min) bad("need 1 <= output_min <= output_max");
  if (c.max_tokens < c.output_max) bad("max_tokens must be >= output_max");
  if (c.max_ctx < c.prompt_max + c.max_tokens) bad("max_ctx must be >= prompt_max + max_tokens");
  if (c.budget_tokens < c.max_ctx) bad("the budget must hold one max-context request (" + std::to_string(c.max_ctx) + " tokens)");
  if (c.n_requests < 1) bad("need at least one request");
  if (c.watermark < 0 || c.watermark >= 1) bad("watermark must be in [0, 1)");
}

}  // namespace

KvSimResult run_kv_sim(const KvSimConfig& cfg, KvSimPolicy policy) {
  validate(cfg);
  std::mt19937_64 rng(cfg.seed);  // same seed: the same workload for every policy
  std::deque<Req> waiting;
  for (int i = 0; i < cfg.n_requests; ++i) {
    Req r;
    r.prompt = std::uniform_int_distribution<int>(cfg.prompt_min, cfg.prompt_max)(rng);
    r.output = std::uniform_int_distribution<int>(cfg.output_min, cfg.output_max)(rng);
    r.max_tokens = cfg.max_tokens;
    waiting.push_back(r);
  }
  const bool paged = policy == KvSimPolicy::Paged;
  const int bs = cfg.block_size;
  const int32_t n_blocks = int32_t(cfg.budget_tokens / bs);
  KvManager kv(paged ? n_blocks : 1, KvManagerOptions::basic(bs, false));
  const int32_t watermark = int32_t(double(n_blocks) * cfg.watermark);
  const std::vector<int32_t> zeros(size_t(cfg.max_ctx), 0);
  const Scope scope{};
  std::vector<Req> running;  // in admission order
  int64_t free_slots = cfg.budget_tokens;  // contiguous policies
  KvSimResult res;
  res.policy = policy;

  auto reservation = [&](const Req& r) -> int64_t {
    return policy == KvSimPolicy::ReserveMaxContext ? cfg.max_ctx : int64_t(r.prompt) + r.max_tokens;
  };

  while (!waiting.empty() || !running.empty()) {
    const bool steady = !waiting.empty();
    bool preempted = false;
    // 1. One decode token for every running request, oldest first.
    for (size_t i = 0; i < running.size(); ++i) {
      Req& r = running[i];
      if (paged) {
        bool ok = kv.reserve(r.seq, 1);
        while (!ok) {
          // Recompute-style preemption of the newest request.
          Req victim = running.back();
          running.pop_back();
          kv.release(victim.seq);
          victim.prompt += victim.generated;
          victim.output -= victim.generated;
          victim.max_tokens -= victim.generated;
          victim.generated = 0;
          victim.seq = -1;
          waiting.push_front(victim);
          ++res.preemptions;
          preempted = true;
          if (i >= running.size()) break;  // it was this request itself
          ok = kv.reserve(r.seq, 1);
        }
        if (i >= running.size()) break;
        kv.commit(r.seq, std::span(zeros.data(), 1));
      }
      ++r.generated;
    }
    // 2. Admission (FIFO, none in a step that had to preempt), prefill in one step.
    while (!preempted && !waiting.empty()) {
      Req r = waiting.front();
      if (paged) {
        if (kv.pool().n_available() - watermark < int32_t((r.prompt + bs - 1) / bs)) break;
        r.seq = kv.add_sequence(std::span(zeros.data(), 0), scope).seq;
        if (!kv.reserve(r.seq, r.prompt)) throw std::logic_error("kv-sim: reserve failed after the check");
        kv.commit(r.seq, std::span(zeros.data(), size_t(r.prompt)));
      } else {
        r.reserved = reservation(r);
        if (r.reserved > free_slots) break;
        free_slots -= r.reserved;
      }
      r.generated = 1;
      waiting.pop_front();
      running.push_back(r);
    }
    // 3. Measure while every resident request holds its memory.
    ++res.steps;
    if (steady) {
      int64_t allocated = 0, tokens = 0;
      for (const Req& r : running) tokens += r.kv_tokens();
      if (paged) {
        const KvStats st = kv.stats();
        allocated = st.used_blocks * bs;
        if (st.stored_tokens != tokens) throw std::logic_error("kv-sim: pool and requests disagree on tokens held");
      } else {
        for (const Req& r : running) allocated += r.reserved;
      }
      ++res.steady_steps;
      res.mean_running += double(running.size());
      res.mean_allocated += double(allocated);
      res.mean_tokens += double(tokens);
      if (allocated > 0) res.max_waste_fraction = std::max(res.max_waste_fraction, 1.0 - double(tokens) / double(allocated));
    }
    // 4. Finished requests leave.
    for (size_t i = 0; i < running.size();) {
      if (running[i].generated < running[i].output) {
        ++i;
        continue;
      }
      if (paged) kv.release(running[i].seq);
      else free_slots += running[i].reserved;
      running.erase(running.begin() + long(i));
      ++res.completed;
    }
  }
  if (res.steady_steps > 0) {
    const double n = double(res.steady_steps);
    res.mean_running /= n;
    res.mean_allocated /= n;
    res.mean_tokens /= n;
    res.waste_fraction = res.mean_allocated > 0 ? 1.0 - res.mean_tokens / res.mean_allocated : 0;
    res.utilization = res.mean_tokens / double(cfg.budget_tokens);
  }
  if (paged) kv.check_invariants();
  return res;
}

std::vector<KvSimResult> run_kv_sim_all(const KvSimConfig& cfg) {
  return {run_kv_sim(cfg, KvSimPolicy::Paged), run_kv_sim(cfg, KvSimPolicy::ReservePromptMax),
          run_kv_sim(cfg, KvSimPolicy::ReserveMaxContext)};
}

std::string kv_sim_table(const KvSimConfig& cfg, const std::vector<KvSimResult>& rs) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line,
                "budget %lld token slots, block size %d, %d requests: prompts %d-%d, outputs %d-%d (max_tokens %d), "
                "context %d, seed %llu\n\n",
                (long long)cfg.budget_tokens, cfg.block_size, cfg.n_requests, cfg.prompt_min, cfg.prompt_max,
                cfg.output_min, cfg.output_max, cfg.max_tokens, cfg.max_ctx, (unsigned long long)cfg.seed);
  s += line;
  s += "| policy | running seqs (mean) | slots allocated | slots holding a token | waste | budget used by tokens | "
       "worst-step waste | preemptions | steps |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const KvSimResult& r : rs) {
    std::snprintf(line, sizeof line, "| %s | %.1f | %.0f | %.0f | %.2f%% | %.1f%% | %.2f%% | %lld | %lld |\n",
                  to_string(r.policy), r.mean_running, r.mean_allocated, r.mean_tokens, 100 * r.waste_fraction,
                  100 * r.utilization, 100 * r.max_waste_fraction, (long long)r.preemptions, (long long)r.steps);
    s += line;
  }
  return s;
}

}  // namespace kvs::tools
