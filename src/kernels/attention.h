// Causal attention of one query token over a sequence's cached K/V, read in
// place through its block table (no gather into a contiguous copy).
#pragma once
#include <cstdint>
#include "kv/kv_layout.h"

namespace kvs {

struct AttnShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;  // 1/sqrt(head_dim)
};

// The query heads that share kv head `g` (GQA group), for keys/values at
// positions [0, n_ctx) of `layer`:
//   q:   [n_heads, head_dim]   (only heads g*r .. g*r+r-1 are read, r = n_heads/n_kv_heads)
//   out: [n_heads, head_dim]   (only those heads are written)
// scratch: at least r * n_ctx floats. Keys are visited in position order, so
// the result for a position does not depend on how the prompt was chunked.
void attention_group(const float* q, const KvStorage& kv, int layer, const int32_t* block_table,
                     int n_ctx, int g, const AttnShape& s, float* out, float* scratch);

// Reference for tests: K/V given contiguously as [n_ctx, n_kv_heads, head_dim].
void attention_reference(const float* q, const float* k, const float* v, int n_ctx,
                         const AttnShape& s, float* out);

}  // namespace kvs
