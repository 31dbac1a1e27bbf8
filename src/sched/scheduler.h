// Continuous batching with admission control, SLO classes and preemption.
//
// Each step():
//   1. cancelled requests leave (blocks freed), queued ones past their
//      class's wait limit are rejected with a Retry-After;
//   2. decode tokens of running choices go first (one each, priority order),
//      then prefill chunks of admitted prompts, under --max-batch-tokens;
//   3. waiting requests are admitted in priority order (interactive, then
//      batch; a batch request that waited batch_age_s counts as
//      interactive) while the token budget, --max-seqs and the block budget
//      allow. An interactive request that does not fit preempts batch
//      requests, most recently admitted first. The head of the queue is never
//      bypassed (no starvation of large requests);
//   4. one executor step over the batch (a failure to reserve blocks
//      preempts the lowest-priority, most recently admitted request and
//      retries, so one request's overrun never fails the batch);
//   5. each choice whose chunk reached the end of its context samples its
//      next token from its own logits row with its own Sampler.
//
// A preempted request keeps its generated tokens; on re-admission each choice
// re-prefills prompt + generated (mostly prefix-cache hits) and continues,
// so its output is the same as uninterrupted.
//
// Block promise (see admission.h): after every admission
//   used blocks + worst-case growth of running requests <= total - headroom
// so with worst_case_reservation a step never runs out of blocks.
//
// Threads: submit(), cancel(), set_accepting() and has_work() may be called
// from any thread; everything else from the engine thread only.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "sched/admission.h"
#include "sched/executor.h"
#include "sched/request.h"
#include "sched/sched_config.h"

namespace kvs::sched {

struct SchedStats {
  int running_requests = 0, running_seqs = 0;
  std::array<int, kNumSloClasses> queued{};
  int64_t total_blocks = 0, headroom_blocks = 0, promised_blocks = 0;
  int64_t preemptions = 0;
  int64_t prefix_waits = 0;  // admissions deferred one step for a prefix another request is computing
  std::array<int64_t, kNumRejectReasons> rejections{};
  int64_t submitted = 0, finished = 0, cancelled = 0;
  int64_t prompt_tokens = 0, prefill_tokens = 0, generated_tokens = 0, steps = 0;
  double drain_blocks_per_s = 0;
  double tokens_per_s = 0;  // model tokens per second over prefill-heavy steps (admission wait estimates)
};

// What one step did (tests, benchmarks).
struct StepReport {
  int decode_tokens = 0, prefill_tokens = 0, seqs = 0;
  std::vector<RequestId> admitted, preempted;
};

class Scheduler {
 public:
  // `is_eog(token)`: the token ends generation (EOS); may be empty.
  // `log`: receives one line per rejection; may be empty.
  Scheduler(StepExecutor& exec, const SchedulerConfig& cfg, std::function<bool(int32_t)> is_eog = {},
            std::function<void(const std::string&)> log = {});
  ~Scheduler();

  // Thread-safe. Validates, applies the request-share cap, tenant quota and
  // queue bound; accepted requests wait for step(). The sink is not used here.
  SubmitResult submit(Request req, double now);
  // Thread-safe. Marks the request; step() frees it before planning.
  bool cancel(RequestId id);
  void set_accepting(bool on);
  bool has_work() const;  // anything queued, running or to cancel

  // Engine thread. One iteration at time `now`; events (text left empty)
  // are appended to `out`.
  StepReport step(double now, std::vector<TokenEvent>& out);
  // Engine thread. The caller ended choice `choice` itself (stop string):
  // its sequence is released, no event is emitted.
  void end_choice(RequestId id, int choice);
  // Engine thread (shutdown): queued requests end Rejected(why), running
  // ones Cancelled; events to `out`.
  void abort_all(RejectReason why, double now, std::vector<TokenEvent>& out);
  Usage usage(RequestId id) const;  // engine thread; zeros when unknown

  SchedStats stats(double now) const;  // engine thread
  // Thread-safe: counters that submit() changes between steps.
  std::array<int64_t, kNumRejectReasons> rejections() const;
  int64_t submitted() const;
  const PoolLimits& limits() const { return lim_; }
  // used + worst-case growth of every running request (engine thread).
  int64_t promised_blocks() const;
  // Throws std::logic_error when the block promise or a bookkeeping
  // invariant is broken (engine thread; tests call it every step).
  void check_invariants() const;

  struct Req;

 private:
  StepExecutor& exec_;
  SchedulerConfig cfg_;
  PoolLimits lim_;
  int bs_;
  std::function<bool(int32_t)> is_eog_;
  std::function<void(const std::string&)> log_;

  mutable std::mutex mu_;  // guards everything submit()/cancel() touch
  bool accepting_ = true;
  RequestId next_id_ = 1;
  std::unordered_map<RequestId, std::unique_ptr<Req>> reqs_;
  std::array<std::deque<Req*>, kNumSloClasses> queue_;  // each in arrival order
  std::unordered_set<RequestId> cancels_;
  std::unordered_map<std::string, int64_t> tenant_blocks_;  // running + queued footprints
  DrainRate drain_;
  TokenRate tok_rate_;             // model tokens per second over prefill-heavy steps
  double last_step_at_ = -1;
  int64_t last_step_tokens_ = 0;   // tokens of the last step, 0 when it ended idle
  int64_t promised_published_ = 0;
  SchedStats st_;

  std::vector<Req*> running_;  // engine thread: admission order
  // Ended requests live until the next step so pointers held while one step
  // finishes several choices stay valid.
  std::vector<std::unique_ptr<Req>> ended_;
  uint64_t admit_counter_ = 0;
  int64_t freed_this_step_ = 0;

  struct Item;
  SloClass effective(const Req& r, double now) const;
  int64_t outstanding(const Req& r) const;
  int64_t admission_cost(const Req& r) const;
  int running_seqs() const;
  Req* queue_head(double now);
  void remove_queued(Req* r);
  void requeue(Req* r);
  bool admit(Req* r, int& budget, std::vector<Item>& plan, double now);
  bool awaits_inflight_prefix(const Req& h) const;
  int64_t estimate_tokens(const Request& req) const;
  double predicted_wait_s(SloClass cls) const;
  int64_t running_prefill_tokens() const;
  void preempt(Req* r, std::vector<Item>& plan, StepReport& rep);
  bool make_room(int64_t need, int64_t limit, std::vector<Item>& plan, StepReport& rep, double now);
  void release_seq(int64_t& seq);
  void end_request(Req* r);
  void finish_choice(Req* r, int c, FinishReason why, int32_t token, std::vector<TokenEvent>& out);
  void sample_choice(Req* r, int c, const float* logits, int n_vocab, std::vector<TokenEvent>& out);
  void reject_locked(Req* r, RejectReason why, double now, std::vector<TokenEvent>& out);
  SubmitResult reject_submit(const Request& req, int64_t need, RejectReason why, std::string msg, double now);
  double retry_estimate(int64_t need, SloClass cls, double now) const;
  std::string log_fields(const Request& req, int64_t need) const;
};

}  // namespace kvs::sched
