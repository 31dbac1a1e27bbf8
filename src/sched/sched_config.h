// Scheduler and admission knobs (the server's command-line flags map onto
// these one to one). Plain data; Scheduler checks ranges at construction.
#pragma once
#include <array>
#include <cstdint>

#include "sched/request.h"

namespace kvs::sched {

struct SchedulerConfig {
  int max_batch_tokens = 512;       // --max-batch-tokens: tokens through the model per step
  int max_seqs = 64;                // --max-seqs: sequences (choices) running at once
  double kv_headroom = 0.05;        // --kv-headroom: share of the pool never promised
  double max_request_share = 0.25;  // --max-request-share: one request's worst case, share of the pool
  double tenant_quota_share = 0.5;  // one tenant's running + queued worst case, share of the pool (>= 1: off)
  double interactive_reserve = 0.10;  // share of the pool that only interactive requests may be promised
  int default_max_tokens = 256;     // cap for requests without max_tokens
  int max_queue = 256;              // --max-queue: waiting requests (all classes)
  // Longest wait in the queue per class before rejection (QueueTimeout).
  std::array<double, kNumSloClasses> wait_limit_s{10.0, 300.0};
  // Share of the wait limit a predicted time to first token may fill before
  // a request is turned away: the prefill-rate prediction is an average, and
  // the limit is a promise about the slowest admitted requests.
  double ttft_margin = 0.8;
  // A batch request that waited this long is ordered (and may use the pool)
  // like an interactive one: no starvation under an interactive flood.
  double batch_age_s = 30.0;
  // When false, admission reserves only the prompt (vLLM style, optimistic)
  // and growth past the free blocks is met by preemption. True (default):
  // prompt + max_tokens is reserved, so running sequences never run dry.
  bool worst_case_reservation = true;
  double drain_halflife_s = 5.0;    // smoothing of the blocks-freed-per-second rate
  double min_retry_after_s = 1.0;   // Retry-After bounds
  double max_retry_after_s = 600.0;
  double fallback_retry_after_s = 2.0;  // before any block was ever freed
  // Added to a Retry-After computed from the prefill rate, as a share of
  // the class's wait limit: a client that comes back a little late finds
  // room, one that comes back at the very instant the estimate names is
  // turned away again by any estimate error, and that costs a whole new wait.
  double retry_pad_share = 0.1;
  // Prefill tokens a step needs for its duration to set the first prefill
  // rate (while none is known, admissions stop once a step holds that many;
  // 0: no such stop, every admission of a cold start is on a guess).
  int rate_sample_tokens = 64;
  // Longest time the queue head waits for a lower KV tier to stage its
  // prefix before it is admitted without it (and recomputes).
  double tier_wait_s = 2.0;
};

}  // namespace kvs::sched
