// Continuous batching with admission control, SLO classes and preemption.
//
// Each step() runs three phases (vLLM v1 / nano-vllm style) that hand each
// other plain data:
//   schedule()  mu_ held. Cancelled requests leave (blocks freed); queued
//               ones that cannot be served within their class's wait limit
//               are rejected with a Retry-After; decode tokens of running
//               choices go first (one each, priority order), then prefill
//               chunks of admitted prompts, under --max-batch-tokens; then
//               waiting requests are admitted in priority order
//               (interactive, then batch; a batch request that waited
//               batch_age_s counts as interactive) while the token budget,
//               --max-seqs and the block budget allow. An interactive
//               request that does not fit preempts batch requests, most
//               recently admitted first. The head of the queue is never
//               bypassed. Result: a StepPlan of slices that name
//               (request, choice, sequence, from, n) and carry their token
//               ids.
//   execute()   no lock. One executor step over the plan (the forward);
//               each choice whose context is now complete draws its next
//               token from its own logits row with its own sampler. Reads
//               the plan and the engine-thread-only samplers, nothing else.
//               Result: a StepOutput (the draws, or "no room", or the
//               error).
//   update()    mu_ held. Sampled tokens are appended, finished choices
//               release their blocks, events go to `out`. Too few free
//               blocks (possible only without worst-case reservation)
//               preempts the lowest-priority, most recently admitted
//               request and the step plans again. A forward that threw
//               fails exactly the requests of that step
//               (FinishReason::Error); the scheduler keeps serving.
// So submit(), cancel() and the counters never wait for a forward pass.
//
// A preempted request keeps its generated tokens; on re-admission each choice
// re-prefills prompt + generated (mostly prefix-cache hits) and continues,
// so its output is the same as uninterrupted.
//
// Block promise (see admission.h): after every admission
//   used blocks + worst-case growth of running requests <= total - headroom
// so with worst_case_reservation a step never runs out of blocks.
//
// Time promise: a request is admitted only while its first token is
// predicted within its class's wait limit (prompt tokens ahead of it and its
// own, at the measured prefill rate); a request turned away is told, in
// Retry-After, when that will hold, counting the clients told to come back
// before it (RetryLedger).
//
// Threads: submit(), cancel(), set_accepting(), set_shed(), shed(),
// has_work(), rejections() and submitted() may be called from any thread;
// everything else from the engine thread only. submit() reads the KV
// manager only through its thread-safe prefix probe; mu_ is the
// "scheduler" rank of sched/ranked_mutex.h.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "grammar/token_mask.h"
#include "sched/admission.h"
#include "sched/ranked_mutex.h"
#include "sched/retry_ledger.h"
#include "sched/executor.h"
#include "sched/request.h"
#include "sched/sched_config.h"
#include "sched/shed_limits.h"

namespace kvs::sched {

struct SchedStats {
  int running_requests = 0, running_seqs = 0;
  int64_t failed = 0;        // requests ended by an engine error (FinishReason::Error)
  std::array<int, kNumSloClasses> queued{};
  int64_t total_blocks = 0, headroom_blocks = 0, promised_blocks = 0;
  int64_t preemptions = 0;
  int64_t prefix_waits = 0;  // admissions deferred one step for a prefix another request is computing
  int64_t tier_waits = 0;    // steps the queue head waited for a lower KV tier to stage its prefix
  std::array<int64_t, kNumRejectReasons> rejections{};
  int64_t submitted = 0, finished = 0, cancelled = 0;
  int64_t prompt_tokens = 0, prefill_tokens = 0, generated_tokens = 0, steps = 0;
  double drain_blocks_per_s = 0;
  double tokens_per_s = 0;  // model tokens per second over prefill-heavy steps (admission wait estimates)
  // Worst-case blocks of each tenant's running and queued requests, and the
  // most one tenant may hold (INT64_MAX: no quota).
  std::vector<std::pair<std::string, int64_t>> tenant_blocks;
  int64_t tenant_quota = 0;
  std::vector<RejectRecord> recent_rejects;  // oldest first, the last kRecentRejects
};
inline constexpr size_t kRecentRejects = 32;

// What one step did (tests, benchmarks).
struct StepReport {
  int decode_tokens = 0, prefill_tokens = 0, seqs = 0;
  std::vector<RequestId> admitted, preempted;
};

struct Choice;    // scheduler_internal.h
struct StepPlan;
struct StepOutput;
struct Sampled;
struct SubmitCheck;

class Scheduler {
 public:
  // `is_eog(token)`: the token ends generation (EOS); may be empty.
  // `log`: receives one line per rejection; may be empty.
  Scheduler(StepExecutor& exec, const SchedulerConfig& cfg, std::function<bool(int32_t)> is_eog = {},
            std::function<void(const std::string&)> log = {});
  ~Scheduler();

  // Thread-safe. Validates, applies the request-share cap, tenant quota,
  // queue bound and predicted wait; accepted requests wait for step(). The
  // sink is not used here. Request::tenant is an opaque quota key, logged
  // verbatim (the server passes the tenant's hash).
  SubmitResult submit(Request req, double now);
  // Thread-safe. Marks the request; step() frees it before planning.
  bool cancel(RequestId id);
  void set_accepting(bool on);
  // Before serving: the text each token id adds (pieces(specials)[id]; ""
  // for end-of-generation tokens, and for control tokens unless `specials`:
  // a request with Request::special_text sees their text, so its grammar
  // matches them by it), for constrained decoding. Without it a request
  // with a grammar is refused.
  void set_vocabulary(std::function<std::vector<std::string>(bool specials)> pieces) {
    vocab_pieces_ = std::move(pieces);
  }
  // Thread-safe. Device shedding on top of the configuration (shed_limits.h):
  // new requests' max_tokens, the step's token budget and the sequences
  // admitted shrink; with stop_admissions submit() answers DeviceBusy.
  // Running requests keep what they were promised.
  void set_shed(const ShedLimits& s);
  ShedLimits shed() const;
  // Anything queued, running or to cancel. Lock-free: the engine loop asks
  // while it holds its inbox lock.
  bool has_work() const { return n_reqs_.load(std::memory_order_acquire) > 0; }

  // Engine thread. One iteration at time `now`; events (text left empty)
  // are appended to `out`.
  StepReport step(double now, std::vector<TokenEvent>& out);
  // Engine thread. The caller ended choice `choice` itself (stop string):
  // its sequence is released, no event is emitted.
  void end_choice(RequestId id, int choice);
  // Engine thread (shutdown): queued requests end Rejected(why), running
  // ones Cancelled; events to `out`.
  void abort_all(RejectReason why, double now, std::vector<TokenEvent>& out);
  // Engine thread: every queued and running request ends with
  // FinishReason::Error and `message` (the scheduler itself failed; the
  // engine loop's last resort so that a broken step never repeats forever).
  void fail_all(const std::string& message, std::vector<TokenEvent>& out);
  Usage usage(RequestId id) const;  // engine thread; zeros when unknown

  SchedStats stats(double now) const;  // engine thread
  // Thread-safe and lock-free: counters that submit() changes between steps.
  std::array<int64_t, kNumRejectReasons> rejections() const;
  int64_t submitted() const { return submitted_.load(std::memory_order_relaxed); }
  const PoolLimits& limits() const { return lim_; }
  // used + worst-case growth of every running request (engine thread).
  int64_t promised_blocks() const;
  // Throws std::logic_error when the block promise or a bookkeeping
  // invariant is broken (engine thread; tests call it every step).
  void check_invariants() const;

  struct Req;
  struct Draws;

 private:
  StepExecutor& exec_;
  SchedulerConfig cfg_;
  PoolLimits lim_;
  int bs_;
  std::function<bool(int32_t)> is_eog_;
  std::vector<int32_t> eog_ids_;  // every id is_eog_ accepts (min_tokens bans them)
  std::function<std::vector<std::string>(bool)> vocab_pieces_;
  // Engine thread, each made at the first constrained request that needs
  // it: [0] without control tokens' text, [1] with it.
  struct GrammarVocab {
    std::vector<std::string> pieces;
    std::unique_ptr<grammar::VocabTrie> trie;
  };
  GrammarVocab vocabs_[2];
  std::function<void(const std::string&)> log_;

  mutable RankedMutex mu_{LockRank::Scheduler};  // guards everything submit()/cancel() touch
  bool accepting_ = true;
  ShedLimits shed_;
  RequestId next_id_ = 1;
  std::unordered_map<RequestId, std::unique_ptr<Req>> reqs_;
  std::atomic<size_t> n_reqs_{0};  // reqs_.size(), for has_work()
  // Engine thread only, never under mu_'s guard (see Draws).
  std::unordered_map<RequestId, std::unique_ptr<Draws>> draws_;
  std::array<std::deque<Req*>, kNumSloClasses> queue_;  // each in arrival order
  std::unordered_set<RequestId> cancels_;
  std::unordered_map<std::string, int64_t> tenant_blocks_;  // running + queued footprints
  DrainRate drain_;
  TokenRate tok_rate_;             // model tokens per second over prefill-heavy steps
  RetryLedger ledger_;             // clients told to come back later, and when
  double last_step_at_ = -1;
  int64_t last_step_tokens_ = 0;   // tokens of the last step, 0 when it ended idle
  int64_t promised_published_ = 0;
  SchedStats st_;
  std::array<std::atomic<int64_t>, kNumRejectReasons> rejections_{};
  std::atomic<int64_t> submitted_{0};
  std::deque<RejectRecord> recent_rejects_;  // under mu_

  std::vector<Req*> running_;  // admission order
  // Ended requests live until the next step so pointers held while one step
  // finishes several choices stay valid.
  std::vector<std::unique_ptr<Req>> ended_;
  uint64_t admit_counter_ = 0;
  int64_t freed_this_step_ = 0;

  // schedule() (scheduler_plan.cpp). `admissions`: false when the step plans
  // again after running out of blocks (no admissions until it has run).
  StepPlan schedule(double now, std::vector<TokenEvent>& out, bool admissions);
  void add_slice(StepPlan& plan, const Req& r, int choice, int from, int n) const;
  Draws& draws_of(const Req& r);
  bool grammar_starts(Req* r, double now, std::vector<TokenEvent>& out);
  void take_cancels(std::vector<TokenEvent>& out);
  void expire_queued(double now, std::vector<TokenEvent>& out);
  // Decodes (cls empty) or the prefill chunks of running requests of
  // effective class `*cls` exactly.
  void plan_running(StepPlan& plan, int& budget, double now, std::optional<SloClass> cls);
  // Queue heads of effective class `cls` while they fit.
  void admit_queued(StepPlan& plan, int& budget, double now, std::vector<TokenEvent>& out, SloClass cls);
  void trim_queue(double now, std::vector<TokenEvent>& out);
  SloClass effective(const Req& r, double now) const;
  int64_t outstanding(const Req& r) const;
  int64_t admission_cost(const Req& r) const;
  int running_seqs() const;
  int batch_tokens() const;  // --max-batch-tokens under the shed limits
  int admit_seqs() const;    // --max-seqs for admissions under the shed limits
  Req* queue_head(double now);
  void remove_queued(Req* r);
  void requeue(Req* r);
  void admit(Req* r, int& budget, StepPlan& plan);
  void admit_handover(Req* r, StepPlan& plan, std::vector<TokenEvent>& out);
  void preempt(Req* r, StepPlan& plan);
  bool make_room(int64_t need, int64_t limit, StepPlan& plan, double now);
  // execute() and update() (scheduler_update.cpp)
  StepOutput execute(const StepPlan& plan);
  void prompt_logprobs(const StepPlan& plan, size_t item, const StepResult& res, StepOutput& out);
  // The grammar's mask for a constrained choice's next draw (end of
  // generation in it where the grammar may end).
  std::vector<uint64_t> grammar_mask(const grammar::Matcher& m, const Draws& d);
  bool grammar_allows(const grammar::Matcher& m, int32_t token, const Draws& d) const;
  // True when the step must plan again (it ran out of blocks and preempted).
  bool update(StepPlan& plan, const StepOutput& res, double now, std::vector<TokenEvent>& out);
  void preempt_for_room(StepPlan& plan, double now);
  void apply_sample(Req* r, int ci, const Sampled& s, std::vector<TokenEvent>& out);
  void fail_choice(Req* r, int ci, const std::string& message, std::vector<TokenEvent>& out);
  void hand_off(Req* r, int ci, const Sampled& s, std::vector<TokenEvent>& out);
  void fail_plan(const StepPlan& plan, const std::string& error, std::vector<TokenEvent>& out);
  // estimates (scheduler_estimates.cpp)
  bool awaits_inflight_prefix(const Req& h) const;
  bool awaits_tier(Req& h, double now);
  void issue_tier_fetch(std::unique_lock<RankedMutex>& lk, RequestId id);
  int64_t estimate_tokens(const Request& req) const;
  int64_t tokens_ahead(SloClass cls, double now) const;
  double predicted_ttft_s(int64_t ahead, int64_t own) const;
  double wait_slack_s(int64_t own, SloClass cls) const;
  bool too_late(int64_t ahead, int64_t own, SloClass cls, double waited) const;
  double time_retry_after(int64_t ahead, int64_t own, SloClass cls, uint64_t fp, double now);
  int cold_sample_tokens() const;
  int64_t running_prefill_tokens(SloClass cls, double now) const;
  // submit and bookkeeping (scheduler.cpp)
  SubmitCheck check_submit(const Request& req, double now);
  // Why the request is invalid whatever the load, and the field at fault.
  struct FieldError {
    std::string message, param;  // message "" when valid
  };
  FieldError invalid_fields(const Request& req) const;
  void release_seq(Choice& c);
  void end_request(Req* r);
  void finish_choice(Req* r, int c, FinishReason why, int32_t token, std::vector<TokenEvent>& out);
  // retry_after_s < 0: estimated from the block drain rate.
  // `message`: the event's text (empty: the reason's standard one).
  void reject_locked(Req* r, RejectReason why, double now, std::vector<TokenEvent>& out, double retry_after_s = -1,
                     const std::string& message = {});
  SubmitResult reject_submit(const Request& req, int64_t need, RejectReason why, std::string msg, double now,
                             std::string param = {});
  void count_rejection(RejectReason why, const Request& req, int64_t need, double now);
  double retry_estimate(int64_t need, SloClass cls, double now) const;
  std::string log_fields(const Request& req, int64_t need) const;
};

}  // namespace kvs::sched
