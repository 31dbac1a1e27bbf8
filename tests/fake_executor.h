// A fake model behind the scheduler for tests and load simulations: real
// KvManager bookkeeping (no K/V memory), logits made up from each sequence's
// tokens, so thousands of requests run in seconds with exact block
// accounting. Logits of a row are a deterministic function of the
// sequence's whole token history (a hash), so greedy output is the same
// alone or batched, chunked or recomputed, as the real engine promises.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "sched/executor.h"

namespace kvs::sched {

struct FakeExecutorOptions {
  int32_t n_blocks = 256;
  int block_size = 16;
  int n_vocab = 64;
  int max_ctx = 4096;
  bool prefix_caching = true;
  int32_t eos = -1;  // >= 0: this id is made likely now and then (tests of EOS handling)
  // KV tables (KvManagerOptions::table_windows, the hybrid cache) and the
  // most tokens one step appends to a sequence (bounds a windowed table).
  std::vector<int> table_windows;
  int max_step_tokens = 512;
};

class FakeExecutor final : public StepExecutor {
 public:
  explicit FakeExecutor(const FakeExecutorOptions& o);
  const KvManager& kv() const override { return kv_; }
  Scope kv_scope(const Scope& caller) const override { return caller; }
  SeqAdmission add(std::span<const int32_t> prompt, const Scope& caller, bool use_cache) override;
  SeqId fork(SeqId seq) override { return kv_.fork(seq); }
  void release(SeqId seq) override { kv_.release(seq); }
  StepResult step(const std::vector<SeqStep>& items) override;
  int n_vocab() const override { return o_.n_vocab; }
  int max_ctx() const override { return o_.max_ctx; }
  void set_tick(int64_t tick) override { kv_.set_tick(tick); }
  int32_t drop_cached_scope(const Scope& caller) override { return kv_.drop_cached_scope(caller); }
  int32_t drop_all_cached() override {
    const auto n = int32_t(kv_.stats().cached_blocks);
    kv_.drop_cached();
    return n;
  }
  int32_t drop_cached_older_than(const Scope& caller, int64_t cutoff) override {
    return kv_.drop_cached_older_than(caller, cutoff);
  }

  // What the fake model predicts after `history` (argmax of its logits).
  int32_t next_token(std::span<const int32_t> history) const;
  // Per executed step: tokens in the batch and sequences in it.
  std::vector<int> step_tokens, step_seqs;
  // Fault injection: called before each step with its items (after the
  // blocks are reserved); may throw, as a failing forward would.
  std::function<void(const std::vector<SeqStep>&)> fault;
  // Per-step delay hook (e.g. a sleep to make a forward take time).
  std::function<void()> on_step;

 private:
  FakeExecutorOptions o_;
  KvManager kv_;
};

}  // namespace kvs::sched
