// --ram-budget SIZE (chat and serve): one memory number for the whole
// process, turned into the KV choices that fit it. Built on plan's
// arithmetic: weights (as stored) + scratch (activations of one step, from
// default_scratch_bytes scaled to the step's token budget) + the KV pool
// must fit the budget.
//
// The choice, in order of preference:
//   1. int8 KV (keys per channel): its quality cost is not measurable, so it
//      is the default whenever the full context fits the batch;
//   2. else int4 KV with per-channel keys (KIVI), the cheapest format whose
//      cost stays small;
//   3. else int4 with fewer sequences, then a shorter hard cap.
// The price of each format is quoted from the measured table in
// docs/KV-QUALITY.md. Weights that do not fit on their own are an error.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kv_layout.h"
#include "tools/presets.h"

namespace kvs::tools {

struct RamBudgetInput {
  uint64_t budget_bytes = 0;
  ModelShape model;           // weight_bytes and the architecture numbers
  int block_size = 16;
  int want_ctx = 0;           // 0: the model's trained context
  int want_batch = 1;         // sequences at once (serve: --max-seqs; chat: one)
  int max_batch_tokens = 512; // tokens per step (scratch scales with it)
  int max_tokens = 256;       // per reply / request, before the budget trims it
};

struct RamBudgetChoice {
  uint64_t budget_bytes = 0, weight_bytes = 0, scratch_bytes = 0, kv_bytes = 0;
  KvType kv_type = KvType::Int8;
  double kv_bytes_per_token = 0;   // of the chosen layout, metadata included
  double mha_bytes_per_token = 0;  // same format if every query head had its own K/V
  int n_heads = 0, n_kv_heads = 0;
  int block_size = 16;
  int64_t kv_blocks = 0;           // the pool
  int hard_cap = 0;                // tokens one sequence may hold
  int window = 0;                  // kept after a chat eviction (half the hard cap)
  int max_tokens = 0, batch = 1, max_batch_tokens = 0;
  std::string quality;             // measured price of the format
  std::vector<std::string> notes;  // what had to give
  std::string describe() const;    // lines for stderr
};

// Throws std::runtime_error with the three sizes when the weights (or the
// weights and the smallest scratch) alone exceed the budget, or when not even
// a short context fits beside them.
RamBudgetChoice choose_for_budget(const RamBudgetInput& in);

// Shortest hard cap worth starting with: below it a chat holds barely one turn.
inline constexpr int kMinHardCap = 64;

// The longest hard cap, at most `ctx`, whose sequence (plus one block of
// slack, as choose_for_budget counts) fits `kv_bytes` in layout `l`; `step`:
// tokens per step. For a KV format given rather than chosen.
int hard_cap_that_fits(const KvLayout& l, uint64_t kv_bytes, int ctx, int step);

// The layout the choice stands for (channel keys, one key group per block).
KvLayout ram_budget_layout(const ModelShape& m, KvType type, int block_size);

}  // namespace kvs::tools
