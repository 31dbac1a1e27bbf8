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
#include <unordered_map>
#include <vector>

#include "engine/sampler.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "sched/scheduler.h"

namespace kvs::sched {

// One choice (n > 1 gives several) of a request: its context is prompt +
// generated tokens; the sequence holds K/V of a prefix of it. Changed by the
// engine thread only, under mu_ (schedule, update).
struct Choice {
  std::vector<int32_t> ctx;      // prompt + generated
  int n_gen = 0;
  SeqId seq = -1;                // -1: not resident (queued, preempted, pending fork, done)
  int have = 0;                  // tokens of ctx with K/V in the cache (0 when not resident)
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
  std::vector<PromptLogprob> prompt_lp;  // Request::prompt_logprobs: gathered as the prompt runs
  bool prompt_lp_done = false;   // all of them (a recompute may use the prefix cache from then on)
  std::vector<Choice> ch;
};

// What sampling carries from step to step for one request: each choice's
// sampler (its random stream) and, with a repetition penalty, its history.
// Engine thread only, outside the requests mu_ guards: execute() draws with
// it while the forward's lock-free phase runs, and no other thread ever
// reaches it. Made at the first admission, gone with the request.
struct Scheduler::Draws {
  struct PerChoice {
    Sampler sampler;
    std::vector<int> hist;       // prompt + generated as int, only with a repetition penalty
    std::unordered_map<int32_t, int> counts;  // generated tokens, only with a presence / frequency penalty
    std::optional<grammar::Matcher> matcher;  // Request::grammar: where this choice's text is in it
  };
  bool counts = false;           // keep `counts`
  std::unique_ptr<grammar::MaskCache> masks;  // Request::grammar: its choices' masks by state
  const GrammarVocab* vocab = nullptr;        // Request::grammar: the token texts it is matched against
  std::vector<int32_t> banned;   // end-of-generation ids and stop_token_ids: banned before min_tokens
  std::vector<PerChoice> ch;
  bool logprobs = false;
  int top_logprobs = 0;
};

// What one choice drew from its logits row in execute(); update() applies it.
struct Sampled {
  RequestId id = 0;
  int choice = 0;
  int32_t token = -1;
  std::optional<TokenLogprob> logprob;
  std::vector<TokenLogprob> top;
  bool forks = false;            // choice 0's prompt is in: pending forks fork off it first
  std::string error;             // the choice's grammar failed (GrammarError): it ends with this
};

// One step's work, from schedule() to execute() and update(), as plain
// data: execute() reads nothing else of the scheduler's state. Row k of the
// forward's logits belongs to slices[k].
struct StepPlan {
  struct Slice {
    RequestId id = 0;
    int choice = 0;
    SeqId seq = -1;
    int from = 0, n = 0;         // ctx[from, from + n) goes through the model
    std::vector<int32_t> tokens; // those n ids
    bool decode = false;         // one generated token (not prompt or recompute)
    bool draws = false;          // the context is complete after it: a token is drawn from its row
    bool ban_end = false;        // the choice has fewer than min_tokens: no end-of-generation draw
    bool all_logits = false;     // every row's logits: prompt logprobs of positions from + 1 ..
    int32_t next_token = -1;     // all_logits: ctx[from + n] when the prompt goes on after this chunk
    std::vector<int> forks;      // choice 0's prompt completes: these choices draw from the same row
  };
  std::vector<Slice> slices;
  StepReport report;
};

// What execute() brings back for update() to apply.
struct StepOutput {
  bool ran = false;              // the forward ran (slices non-empty and it neither threw nor ran out)
  std::vector<SeqId> no_room;    // nothing ran: these sequences found too few free blocks
  std::string error;             // nothing trustworthy ran: the forward threw this
  std::vector<Sampled> samples;  // ran: in the order update() applies them
  std::vector<std::pair<RequestId, PromptLogprob>> prompt_lps;  // ran: in position order per request
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
