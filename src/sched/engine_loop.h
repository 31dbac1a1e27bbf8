// The engine loop: the one thread that owns the scheduler, the KV pool and
// the model while serving. It is the pool's only writer
// (kv/owner_thread.h): other threads talk to it only through this class.
// submit() and cancel() never wait for a forward pass, events leave through
// each request's non-blocking EventSink, metrics() is a snapshot, and
// everything else another thread wants of the pool is a PoolCommand posted
// to its inbox (post(); sched/pool_command.h), which the engine thread
// drains at the top of each iteration.
//
//   EngineLoop loop(engine, &tokenizer, opts);      // starts the thread
//   auto r = loop.submit(std::move(req));           // accepted, or rejected + Retry-After (429)
//   ... req.sink receives TokenEvents on the engine thread ...
//   loop.cancel(r.id);                              // client went away: blocks freed at once
//   loop.drain();                                   // graceful stop: finish what was accepted
//
// Each step the loop asks the Scheduler for a batch (decodes first, then
// prefill chunks under --max-batch-tokens and --max-seqs), runs one
// Engine::forward over it, samples each choice from its own logits row with
// its own Sampler, and turns tokens into text (Detokenizer + StopMatcher).
// At temperature 0 a request's tokens do not depend on the batch, the
// chunking, preemption or the prefix cache.
//
// Locks (sched/ranked_mutex.h gives the order; docs/ARCHITECTURE.md lists
// who takes what): live (rank 1), the scheduler's (2), metrics (3), inbox
// (4, a leaf).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "kv/pool_snapshot.h"
#include "kv/window_policy.h"
#include "sched/pool_command.h"
#include "sched/request.h"
#include "sched/sched_config.h"
#include "sched/shed_limits.h"

namespace kvs {
class Engine;
class Tokenizer;
}  // namespace kvs

namespace kvs::sched {

class StepExecutor;  // executor.h: the KV pool + model behind the scheduler
class PagedExecutor;

struct EngineLoopOptions {
  SchedulerConfig sched;
  int block_size = 16;             // --block-size (8..256)
  uint64_t kv_memory_bytes = 0;    // --kv-memory; 0 = use kv_blocks
  int64_t kv_blocks = 0;           // explicit pool size (tests, benchmarks)
  int max_ctx = 0;                 // 0 = the model's training context
  bool prefix_caching = true;
  KvCacheOptions cache;              // --kv-type and friends
  WindowPolicy window;               // --kv-window/--kv-sinks, --ctx-shift
  // How often the engine thread drops cached blocks past their scope's
  // retention (Request::retention_s), seconds; also its longest idle sleep.
  double retention_sweep_s = 1.0;
  // Seconds on a monotonic clock; tests inject a fake one.
  std::function<double()> clock;
  // Log line per rejection (estimate, tenant hash, class; never prompt text).
  // Default: one line on stderr. Set to a no-op to silence.
  std::function<void(const std::string&)> log;
};

// Cumulative histogram with fixed upper bounds (Prometheus style).
struct Histogram {
  std::vector<double> bounds;    // ascending upper bounds, seconds
  std::vector<uint64_t> counts;  // counts[i]: observations <= bounds[i] and > bounds[i-1]; last: > all bounds
  double sum = 0;
  uint64_t count = 0;
  static Histogram latency();    // 1 ms .. 60 s, roughly x2 steps
  void observe(double v);
  double quantile(double q) const;  // upper bound of the bucket holding quantile q (approximation)
};

struct MetricsSnapshot {
  int running_requests = 0, running_seqs = 0;
  std::array<int, kNumSloClasses> queued{};          // waiting per class
  int64_t kv_blocks_total = 0, kv_blocks_free = 0, kv_blocks_cached = 0, kv_blocks_used = 0;
  int64_t kv_blocks_promised = 0;   // used + worst-case growth of running requests
  int64_t kv_headroom_blocks = 0;
  int block_size = 0;
  int64_t kv_block_bytes = 0;  // bytes of one pool block (0: not known to the executor)
  // The hybrid cache: per KV table its layers' window (0 = full) and the
  // used blocks serving it (KvStats::table_blocks).
  std::vector<int> kv_table_windows;
  std::vector<int64_t> kv_table_blocks;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t prefix_dropped_revoke = 0, prefix_dropped_retention = 0;  // cached blocks dropped
  int64_t prefix_dropped_device = 0;  // cached blocks dropped by device shedding
  int64_t preemptions = 0;
  int64_t prefix_waits = 0;  // admissions deferred for a prefix in flight
  std::array<int64_t, kNumRejectReasons> rejections{};  // by RejectReason
  int64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0;
  int64_t requests_failed = 0;      // ended by an engine error (finish_reason "error")
  int64_t prompt_tokens = 0;        // over admitted requests (first admission)
  int64_t prefill_tokens = 0;       // prompt (and recompute) tokens that went through the model
  int64_t generated_tokens = 0;
  int64_t steps = 0;
  double drain_blocks_per_s = 0;    // smoothed rate of freed blocks (Retry-After basis)
  Histogram ttft, tpot, e2e;        // seconds; tpot = (e2e - ttft) / (tokens - 1) per choice
  std::array<Histogram, kNumSloClasses> ttft_by_class, tpot_by_class;
  // Worst-case blocks of each tenant's running + queued requests (tenant =
  // the quota key, a hash), and the per-tenant cap (INT64_MAX: none).
  std::vector<std::pair<std::string, int64_t>> tenant_blocks;
  int64_t tenant_quota_blocks = 0;
  std::vector<RejectRecord> recent_rejects;  // oldest first
};

// The pool cell by cell, taken on the engine thread together with the
// metrics of the same instant (so its counts are the ones /metrics showed
// then). owner_tenants[i] is the tenant (quota key) that submitted under
// cells.owners[i], "" when not known.
struct PoolView {
  double t = 0;
  MetricsSnapshot metrics;
  PoolCells cells;
  std::vector<std::string> owner_tenants;
  // Most requests waiting at any published instant since the previous view
  // (a burst shorter than the viewer's period still shows).
  int queued_peak = 0;
};

// The executor EngineLoop(engine, ...) runs: a paged pool over `engine`,
// sized by `opts` (for callers that wrap it, e.g. the KV-event hook).
std::unique_ptr<PagedExecutor> paged_executor(Engine& engine, const EngineLoopOptions& opts);

class EngineLoop final : public PoolInbox {
 public:
  // Serves `engine` (not owned; must outlive the loop) over a paged pool
  // sized by opts. `tokenizer` (may be null: no text, no stop strings, EOS
  // from the model's vocab is then not detected) must outlive the loop.
  // Throws std::invalid_argument on bad options. Starts the engine thread.
  EngineLoop(Engine& engine, const Tokenizer* tokenizer, const EngineLoopOptions& opts);
  // Same over any executor (tests: a fake engine).
  EngineLoop(std::unique_ptr<StepExecutor> exec, const Tokenizer* tokenizer, const EngineLoopOptions& opts);
  ~EngineLoop() override;  // shutdown()
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Thread-safe and quick (no forward pass in the way). Accepted requests are
  // queued; their events arrive through req.sink. A rejected request gets no
  // events. Retryable rejections carry retry_after_s (HTTP 429 Retry-After).
  SubmitResult submit(Request req);
  // Thread-safe. Aborts a queued or running request: its blocks are freed
  // before the next step and its choices end with FinishReason::Cancelled.
  // False when the id is unknown or already finished.
  bool cancel(RequestId id);

  // Thread-safe. Drops the prefix cache of caller scope `scope` (a revoked
  // tenant): the engine thread frees its cached blocks before its next step;
  // blocks held by running requests are never hit again and are freed, not
  // cached, when released. Blocks until done; returns the blocks freed now
  // (0 once the loop has shut down).
  int64_t drop_scope(const Scope& scope);

  // Thread-safe. Device shedding (shed_limits.h) from now on; when
  // drop_prefix_cache turns on, the engine thread drops every cached block
  // before its next step. Compute threads are the caller's to limit.
  void set_shed_limits(const ShedLimits& s);
  ShedLimits shed_limits() const;
  // Thread-safe. Releases a sequence a hand-off event gave away
  // (TokenEvent::hand_off) before the next step: post(Release).
  void release_held(int64_t seq);
  // Thread-safe, never waits: the engine thread runs the command between
  // two steps (answering its promise, if it has one). After shutdown a
  // command is answered at once (nothing freed, no slots).
  void post(PoolCommand c) override;

  MetricsSnapshot metrics() const;  // thread-safe snapshot; never waits for a step
  // Thread-safe. Asks the engine thread for a PoolView in at most max_cells
  // cells and waits up to timeout_s for it (it is taken between two steps);
  // on time-out returns the latest one taken (null before the first).
  std::shared_ptr<const PoolView> pool_view(int32_t max_cells, double timeout_s);
  // Stop accepting (ShuttingDown) and block until every accepted request has
  // finished. The thread keeps running (metrics stay readable).
  void drain();
  // Blocks until nothing is queued or running and every final event has
  // left; keeps accepting (tests, benchmarks).
  void wait_idle();
  // Stop accepting; queued requests end Rejected(ShuttingDown), running ones
  // Cancelled; joins the thread, and the caller owns the pool from then on.
  // Idempotent.
  void shutdown();

  const EngineLoopOptions& options() const;
  int64_t kv_blocks_total() const;
  int block_size() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvs::sched
