// One sequence with its own private KV blocks (block table 0, 1, 2, ...):
// the simple path used by `generate`, `perplexity`, `bench` and tests.
// The serving path shares one block pool between many sequences instead.
#pragma once
#include <cstdint>
#include <vector>
#include "engine/kv_cache.h"
#include "kv/block_storage.h"
#include "kvserve/engine.h"

namespace kvs {

class LocalSequence {
 public:
  LocalSequence(Engine& e, int max_ctx, int block_size = 16, const KvCacheOptions& cache = {});
  // Appends `tokens` to the sequence in one forward (chunks of at most
  // `max_chunk` tokens); returns the logits of the last token ([n_vocab]) or,
  // with all_logits, of every appended token ([n, n_vocab]).
  const std::vector<float>& eval(const int32_t* tokens, int n, bool all_logits = false, int max_chunk = 0);
  const std::vector<float>& eval(const std::vector<int32_t>& t, bool all = false) {
    return eval(t.data(), int(t.size()), all);
  }
  int n_past() const { return n_past_; }
  int max_ctx() const { return max_ctx_; }
  void reset() { n_past_ = 0; }
  // Drops tokens past n. A quantized cache can only go back to a group
  // boundary (the residual rows of a group are gone once it is stored):
  // throws std::invalid_argument otherwise.
  void truncate(int n);
  const KvLayout& layout() const { return storage_.view().layout; }

 private:
  Engine& e_;
  int max_ctx_;
  BlockStorage storage_;
  std::vector<int32_t> table_;
  std::vector<float> logits_, part_;
  std::vector<float> residual_;  // quantized cache: [KvLayout::residual_floats()]
  int n_past_ = 0;
};

}  // namespace kvs
