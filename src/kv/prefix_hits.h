// Prefix hits across KV tables (the hybrid cache, kernels/kv_groups.h): a
// hit of h logical blocks must be valid in every table. A full-attention
// table needs blocks 0..h-1; a windowed one only the blocks the sequence's
// next query can see (as vLLM's hybrid manager does), the rest of its
// entries stay -1. Plain functions over plain data, used by KvManager.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/window_policy.h"

namespace kvs {

// Prompt tokens whose K/V come from the cache when `hit_blocks` full blocks
// are found: all of them, except that a fully cached prompt recomputes its
// last token (a quantized cache: its last token group) for the logits.
int64_t cached_tokens_for_hit(int64_t hit_blocks, int64_t prompt_tokens, int block_size, int align_tokens);

// Whether a sequence starting with `cached` tokens in the cache needs
// logical block i of a table under `w`: one of its first ceil(cached / B)
// blocks that the query at text index `cached` (or a later one) can see.
bool hit_needs_block(const TableWindow& w, int64_t i, int64_t cached, int block_size);

// The largest h such that, for every table t, each block hit_needs_block
// at cached_tokens_for_hit(h) has avail[t][i] set. avail[t] holds one entry
// per full prompt block walked (the same count for every table); h never
// exceeds it.
int64_t largest_hit(const std::vector<TableWindow>& tables, const std::vector<std::vector<uint8_t>>& avail,
                    int64_t prompt_tokens, int block_size, int align_tokens);

}  // namespace kvs
