// One sequence with its own private KV blocks: the simple path used by
// `generate`, `perplexity`, `eval`, `bench` and tests. The serving path
// shares one block pool between many sequences instead.
//
// Without a window policy the blocks are 0, 1, 2, ... up to max_ctx. With
// one (kv/window_policy.h, or the model's native window) the sequence may
// grow past its memory: blocks no later token can see are recycled, so the
// KV memory stays at what the policy keeps visible (plus one chunk).
// A hybrid cache (kernels/kv_groups.h) has one block table per KV table;
// each table recycles what its own window (TableWindow) hides.
#pragma once
#include <cstdint>
#include <vector>
#include "engine/kv_cache.h"
#include "kv/block_storage.h"
#include "kv/window_policy.h"
#include "kvserve/engine.h"

namespace kvs {

class LocalSequence {
 public:
  // max_ctx: the longest the sequence may get (tokens); with a bounding
  // window policy the memory is sized by the policy instead.
  LocalSequence(Engine& e, int max_ctx, int block_size = 16, const KvCacheOptions& cache = {},
                const WindowPolicy& window = {});
  // Appends `tokens` to the sequence (forwards of at most `max_chunk` tokens;
  // 0 = kDefaultChunk, at most kMaxWindowChunk under a window policy); returns the
  // logits of the last token ([n_vocab]) or, with all_logits, of every
  // appended token ([n, n_vocab]).
  const std::vector<float>& eval(const int32_t* tokens, int n, bool all_logits = false, int max_chunk = 0);
  const std::vector<float>& eval(const std::vector<int32_t>& t, bool all = false) {
    return eval(t.data(), int(t.size()), all);
  }
  int n_past() const { return n_past_; }
  int max_ctx() const { return max_ctx_; }
  void reset();
  // Drops tokens past n. A quantized cache can only go back to a group
  // boundary (the residual rows of a group are gone once it is stored), and
  // a windowed sequence cannot go back at all: throws std::invalid_argument.
  void truncate(int n);
  const KvLayout& layout() const { return storage_.view().layout; }
  const WindowPolicy& window() const { return window_; }
  int n_tables() const { return int(tables_.size()); }
  const std::vector<int32_t>& block_table(int table = 0) const { return tables_.at(size_t(table)); }
  // Blocks holding K/V now (every table), and the most ever held (memory stays bounded).
  int live_blocks() const { return int(storage_.n_blocks()) - int(free_.size()); }
  int live_blocks(int table) const;
  int peak_blocks() const { return peak_blocks_; }
  int capacity_blocks() const { return int(storage_.n_blocks()); }  // allocated once, never grows
  int64_t block_bytes() const { return int64_t(storage_.view().layout.block_bytes()); }
  // The sequence as bytes (length, which blocks of its table are live, their
  // K/V, the quantized residual) and back: a saved chat resumes without
  // recomputing its context. load_state throws std::invalid_argument when
  // the bytes come from another layout, do not fit, or are malformed.
  std::vector<uint8_t> save_state() const;
  void load_state(const std::vector<uint8_t>& bytes);

  static constexpr int kMaxWindowChunk = 512;
  // serve's default --max-batch-tokens: prompts run in the chunks a served one does
  static constexpr int kDefaultChunk = 512;

 private:
  Engine& e_;
  int max_ctx_;
  WindowPolicy window_;
  std::vector<TableWindow> tw_;  // per KV table: the policy and the table's own window
  BlockStorage storage_;
  // Per KV table, per logical block: physical block, -1 = freed by the window.
  std::vector<std::vector<int32_t>> tables_;
  std::vector<const int32_t*> table_ptrs_;  // SeqChunk::block_tables
  std::vector<int32_t> free_;   // physical blocks not in use
  std::vector<float> logits_, part_;
  std::vector<float> residual_;  // quantized cache: [KvLayout::residual_floats()]
  int n_past_ = 0, peak_blocks_ = 0;
  void ensure_blocks(int n_tokens);  // every table covers [0, n_tokens)
  void free_dead();                  // recycle blocks the windows hide from every later token
  bool frees() const;                // some table recycles blocks
};

}  // namespace kvs
