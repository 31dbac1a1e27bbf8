// Helpers for tests that drive the engine's forward pass directly.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "kvserve/engine.h"

namespace kvs::test {

// n token ids drawn uniformly from [3, n_vocab), deterministic in `seed`
// (ids below 3 are the special tokens of the test models).
inline std::vector<int32_t> random_tokens(int n, int n_vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(3, n_vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

// One sequence's chunk of a forward: its block table, the tokens appended
// after n_past = 0, and whether every token's logits come back.
inline SeqChunk seq_chunk(const int32_t* table, const int32_t* tokens, int n_tokens, bool all_logits) {
  SeqChunk c;
  c.block_table = table;
  c.tokens = tokens;
  c.n_tokens = n_tokens;
  c.all_logits = all_logits;
  return c;
}

}  // namespace kvs::test
