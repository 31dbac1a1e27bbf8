// The serving path's engine API: many sequences over one shared, paged KV
// pool. Owns the KV memory (BlockStorage) and its bookkeeping (KvManager);
// runs Engine::forward over every scheduled sequence's chunk at once, with
// attention reading K/V through each sequence's block table.
//
//   PagedEngine pe(engine, opts);            // sizes the pool from a byte budget
//   auto a = pe.add(prompt, scope);          // a.cached_tokens came from the prefix cache
//   auto r = pe.step({{a.seq, tail_of(prompt, a)}});   // prefill the rest; r.logits(0)
//   r = pe.step({{a.seq, {next}}});          // decode
//   SeqId b = pe.fork(a.seq);                // shares every block (copy-on-write)
//   pe.release(a.seq);                       // full blocks stay cached (LRU)
//
// Running out of KV blocks is a normal answer (StepResult::ok == false,
// nothing ran, nothing changed but copy-on-write copies); what to preempt is
// the scheduler's decision. Not thread-safe: the engine thread calls it.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "engine/kv_cache.h"
#include "kv/block_storage.h"
#include "kv/kv_manager.h"
#include "kvserve/engine.h"

namespace kvs {

// The user-facing --block-size range; the class itself accepts 1..256 (tests).
inline constexpr int kMinUserBlockSize = 8, kMaxUserBlockSize = 256, kDefaultBlockSize = 16;
// Throws std::invalid_argument naming the accepted range.
void check_block_size_option(int block_size);

struct PagedEngineOptions {
  int block_size = kDefaultBlockSize;
  uint64_t kv_memory_bytes = 0;  // KV budget (--kv-memory); 0 = use n_blocks
  int64_t n_blocks = 0;          // explicit pool size (tests, simulations)
  int max_ctx = 0;               // longest sequence; 0 = the model's training context
  bool prefix_caching = true;    // --no-prefix-cache turns it off
  KvCacheOptions cache;          // --kv-type and friends
  WindowPolicy window;           // --kv-window/--kv-sinks, --ctx-shift; None = the model's native window, if any
  int max_step_tokens = 512;     // most tokens one sequence appends per step (window memory bound)
};

// Blocks a byte budget holds for this model and cache type.
int64_t kv_blocks_for_budget(const Engine& engine, int block_size, uint64_t bytes, const KvCacheOptions& cache = {});

struct SeqStep {
  SeqId seq = -1;
  std::span<const int32_t> tokens;  // appended at positions tokens(seq) .. +n-1
  bool all_logits = false;          // logits of every token, else of the last one
};

struct StepResult {
  bool ok = false;              // false: not enough free KV blocks, nothing ran
  std::vector<SeqId> no_room;   // the sequences whose reservation failed
  std::vector<float> logits;    // [rows, n_vocab], rows in item order
  std::vector<int64_t> row0;    // first row of each item
  int n_vocab = 0;
  const float* logits_of(size_t item, int token = -1) const {  // token -1 = last row of the item
    const int64_t last = (item + 1 < row0.size() ? row0[item + 1] : int64_t(logits.size()) / n_vocab) - 1;
    return logits.data() + size_t(token < 0 ? last : row0[item] + token) * size_t(n_vocab);
  }
};

struct PagedStats {
  KvStats kv;
  int64_t forward_tokens = 0;  // tokens that went through the model in step()
  int64_t steps = 0;
  int64_t kv_bytes = 0;        // size of the pool's memory
};

class PagedEngine {
 public:
  // Throws std::invalid_argument when the block size is outside 1..256, the
  // budget is missing, or the pool cannot hold one max_ctx-token sequence.
  PagedEngine(Engine& engine, const PagedEngineOptions& opts);
  ~PagedEngine();
  PagedEngine(const PagedEngine&) = delete;
  PagedEngine& operator=(const PagedEngine&) = delete;

  // Registers a request; the longest cached chain of its prompt's full blocks
  // is attached. The caller must step prompt[cached_tokens..] next (never
  // empty: the last prompt token is always recomputed for its logits). The
  // model identity is folded into `scope` here, so equal caller scopes on
  // different models never share blocks.
  SeqAdmission add(std::span<const int32_t> prompt, const Scope& scope = {}, bool use_cache = true);
  // The scope the KV manager keys this caller's blocks with (model identity
  // folded in): for side-effect-free probes such as
  // kv().cached_prefix_blocks(prompt, kv_scope(caller)).
  Scope kv_scope(const Scope& caller) const;
  // One Engine::forward over all items (each sequence at most once).
  StepResult step(const std::vector<SeqStep>& items) {
    StepResult r;
    step(items, r);
    return r;
  }
  // Same, reusing `out`'s buffers (the decode loop: no allocation per step).
  void step(const std::vector<SeqStep>& items, StepResult& out);
  SeqId fork(SeqId seq) { return kv_.fork(seq); }
  void release(SeqId seq) { kv_.release(seq); }
  // Lower KV tiers (not owned; null = none): newly keyed blocks are offered
  // to it, and add() loads the blocks it has staged for a prompt instead of
  // recomputing them. Call before the first add().
  void set_tier(KvTierPort* tier);
  // Any thread: asks the tier to stage the prompt's full blocks that the RAM
  // index lacks (KvTierPort::prefetch). 0 = nothing to wait for.
  uint64_t prefetch(std::span<const int32_t> prompt, const Scope& caller, double retention_s) const;
  bool prefetch_pending(uint64_t ticket) const { return tier_ && ticket && tier_->pending(ticket); }
  double prefetch_seconds(uint64_t ticket) const { return tier_ && ticket ? tier_->seconds(ticket) : -1; }
  bool has_tier() const { return tier_ != nullptr; }
  // Disaggregated serving (src/disagg), decode side: the prompt is checked
  // as add() checks it and the caller scope folded as add() folds it, then
  // KvManager::reserve_adoption. A window policy that frees blocks is
  // refused (std::invalid_argument): the table would have holes.
  KvManager::Adoption reserve_adoption(std::span<const int32_t> prompt, const Scope& caller);
  void finish_adoption(SeqId seq, std::span<const int32_t> prompt) { kv_.finish_adoption(seq, prompt); }
  // The sequence's full-precision residual (quantized cache; empty otherwise).
  std::span<float> residual(SeqId seq) {
    float* p = kv_.residual(seq);
    return {p, p ? kv_.residual_view(seq).size() : 0};
  }
  // All K/V bytes of one pool block: what a transfer moves.
  std::span<uint8_t> block(int32_t b) { return storage_->block(b); }
  const KvLayout& layout() const { return storage_->view().layout; }
  // Forget every cached block (cold prefix cache).
  void drop_cached() { kv_.drop_cached(); }
  // The caller's monotonic tick (KvManager::set_tick): last use of blocks.
  void set_tick(int64_t tick) { kv_.set_tick(tick); }
  // Drops the prefix cache of a caller scope (model identity folded in, as
  // add() does): KvManager::drop_cached_scope. Returns the cached blocks freed.
  // The tier forgets the scope too (deleted in the background).
  int32_t drop_cached_scope(const Scope& caller);
  // Cached blocks of the caller scope last used before `cutoff` become free.
  int32_t drop_cached_older_than(const Scope& caller, int64_t cutoff) {
    return kv_.drop_cached_older_than(kv_scope(caller), cutoff);
  }

  const KvManager& kv() const { return kv_; }
  // Prefix-index changes go to `log` from now on (KvManager::set_event_log).
  void set_kv_event_log(KvEventLog* log) { kv_.set_event_log(log); }
  int block_size() const { return kv_.block_size(); }
  int max_ctx() const { return max_ctx_; }
  const WindowPolicy& window() const { return window_; }
  int64_t n_blocks() const { return storage_->n_blocks(); }
  PagedStats stats() const;
  Engine& engine() { return engine_; }

 private:
  Engine& engine_;
  int max_ctx_;
  WindowPolicy window_;  // in force for every sequence: the user's, or the model's native window
  std::unique_ptr<BlockStorage> storage_;
  KvManager kv_;
  std::vector<SeqChunk> chunks_;
  std::vector<const int32_t*> table_ptrs_;  // [items, n_tables] SeqChunk::block_tables of a step
  std::vector<SeqId> ids_;  // duplicate check
  KvTierPort* tier_ = nullptr;
  struct TierImporter;
  std::unique_ptr<TierImporter> importer_;
  void check_prompt(std::span<const int32_t> prompt, int64_t limit) const;
  static void on_keyed(void* self, int32_t block, const BlockKey& key, const BlockKey* parent, const Scope& scope);
  int64_t forward_tokens_ = 0, steps_ = 0;
};

// prompt[cached_tokens..]: what the caller steps after add().
inline std::span<const int32_t> uncached_tail(std::span<const int32_t> prompt, const SeqAdmission& a) {
  return prompt.subspan(size_t(a.cached_tokens));
}

}  // namespace kvs
