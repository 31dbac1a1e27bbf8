// Scheduler and admission knobs (the server's command-line flags map onto
// these one to one). Plain data; Scheduler checks ranges at construction.
#pragma once
#include <array>
#include <cstdint>

#include "sched/request.h"

namespace kvs::sched {

// How a preempted request gives back its blocks. Only recompute exists: on
// this CPU backend the KV pool already is host memory, so "swapping blocks to
// host memory" (vLLM's --swap-space, GPU -> CPU) would only move bytes
// outside the pool's budget, i.e. over-commit memory. A preempted request's
// full blocks go to the prefix cache's LRU; its recompute re-uses the ones
// not evicted meanwhile (under the pressure that caused the preemption,
// often none).
enum class PreemptMode : uint8_t {
  Recompute,  // free the victim's blocks; re-prefill prompt + generated tokens later (prefix cache helps)
};

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
  // A batch request that waited this long is ordered (and may use the pool)
  // like an interactive one: no starvation under an interactive flood.
  double batch_age_s = 30.0;
  // When false, admission reserves only the prompt (vLLM style, optimistic)
  // and growth past the free blocks is met by preemption. True (default):
  // prompt + max_tokens is reserved, so running sequences never run dry.
  bool worst_case_reservation = true;
  PreemptMode preempt = PreemptMode::Recompute;
  double drain_halflife_s = 5.0;    // smoothing of the blocks-freed-per-second rate
  double min_retry_after_s = 1.0;   // Retry-After bounds
  double max_retry_after_s = 600.0;
  double fallback_retry_after_s = 2.0;  // before any block was ever freed
};

}  // namespace kvs::sched
