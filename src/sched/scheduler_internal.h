// Internal to src/sched: the scheduler's per-request state and the plain
// data its phases hand each other, shared by scheduler.cpp (submit and
// bookkeeping), scheduler_plan.cpp (schedule), scheduler_update.cpp (execute,
// update) and scheduler_estimates.cpp (admission-time estimates).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sched/scheduler.h"

namespace kvs::sched {

// One choice (n > 1 gives several) of a request: its context is prompt +
// generated tokens; the sequence holds K/V of a prefix of it. Written by the
// engine thread only (under mu_ except for reads during the forward).
struct Choice {
  std::vector<int32_t> ctx;      // prompt + generated
  int n_gen = 0;
  SeqId seq = -1;                // -1: not resident (queued, preempted, pending fork, done)
  int have = 0;                  // tokens of ctx with K/V in the cache (0 when not resident)
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
  bool seen = false;             // a schedule() pass has considered it (counts against --max-queue)
  uint64_t admit_order = 0;
  uint64_t fingerprint = 0;      // request_fingerprint: a client returning after a 429
  int cached_tokens = 0;
  int imported_tokens = 0;       // of cached_tokens, loaded from a lower KV tier
  bool tier_issuing = false;     // submit() has yet to ask the tier to stage its prefix
  uint64_t tier_ticket = 0;      // that fetch (0: none)
  double tier_load_ms = -1;      // how long it took (-1: no fetch)
  int64_t est_tokens = 0;        // prompt tokens it will likely run (cached / shared prefix excluded)
  std::vector<Choice> ch;
};

// What one choice drew from its logits row during execute() (no lock held);
// update() applies it.
struct Sampled {
  Scheduler::Req* r = nullptr;
  int choice = 0;
  int32_t token = -1;
  bool eog = false;              // ends generation (EOS, not ignored)
  std::optional<TokenLogprob> logprob;
  std::vector<TokenLogprob> top;
  bool forks = false;            // choice 0's prompt is in: pending forks fork off it first
};

// One step's work, from schedule() to execute() and update(). Row k of the
// forward's logits belongs to slices[k].
struct StepPlan {
  struct Slice {
    Scheduler::Req* r;
    int choice;
    int from, n;                 // ctx[from, from + n) goes through the model
  };
  std::vector<Slice> slices;
  StepReport report;
  bool ran = false;              // the forward ran (slices non-empty and it did not throw)
  std::vector<Sampled> samples;  // execute(): in the order update() applies them
};

// What submit() decided, and the figures it keeps for an accepted request.
struct SubmitCheck {
  SubmitResult res;              // accepted, or the rejection
  int max_tokens = 0;            // after the default cap and the context clamp
  int64_t need = 0;              // worst-case blocks
  int64_t est_tokens = 0;
  uint64_t fingerprint = 0;
};

// Length of the common prefix of two token sequences.
inline size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace kvs::sched
