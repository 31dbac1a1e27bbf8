// Causal attention of one query token over a sequence's cached K/V, read in
// place through its block table (no gather into a contiguous copy).
#pragma once
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include "kernels/kv_layout.h"

namespace kvs {

struct AttnShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;    // 1/sqrt(head_dim), or the model's query scale
  float softcap = 0.0f;  // > 0: scores = softcap * tanh(scale * q.k / softcap) (Gemma 2)
  // [n_heads] learned attention sinks (gpt-oss): head h's softmax has one
  // more term, exp(sinks[h]), with no value; null = none. Not a kept token:
  // a window never hides it (unlike WindowPolicy's sink tokens).
  const float* sinks = nullptr;
  // Both products on AMX-BF16 tiles (flash_attention.h's bf16 variant;
  // models loaded with MatmulPrecision::Bf16). Needs amx_bf16_active();
  // a head_dim that is no multiple of 16 keeps the fp32 kernel.
  bool bf16 = false;
};

// One query token's view of its sequence's keys and values: positions
// [0, n_stored) are read from the block storage through `block_table`;
// positions [n_stored, n_ctx) (the quantized cache's not yet quantized
// residual group, at most group_tokens of them) from the float rows
// own_k / own_v ([n_ctx - n_stored, kvdim], row stride kvdim).
//
// A window policy (kv/window_policy.h) hides keys: only [0, sink_end) and
// [win_start, n_ctx) are visible (sink_end >= win_start: all). A layer's own
// sliding window (window = W > 0; 0 = none) hides every key k with
// (n_ctx - 1) - k >= W, i.e. keys before n_ctx - W, on top of the policy:
// the query at text index p sees key k only if p - k < W (llama.cpp's SWA
// mask). With rope_cos/rope_sin the keys are stored before RoPE and rotated
// here to position i (i < sink_end) or i - shift (tables [position, n_rot/2]).
struct AttnSeq {
  const int32_t* block_table = nullptr;
  int n_ctx = 0;
  int n_stored = 0;
  const float* own_k = nullptr;
  const float* own_v = nullptr;
  int sink_end = 0, win_start = 0;
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  int shift = 0, n_rot = 0;
  bool neox = false;
  int window = 0;
  // Keys [lo(), n_ctx) pass the layer's window.
  int lo() const { return window > 0 && n_ctx > window ? n_ctx - window : 0; }
  // Keys the query sees.
  int n_visible() const {
    const int lo_ = lo();
    if (sink_end >= win_start) return n_ctx - lo_;
    return std::max(0, sink_end - lo_) + (n_ctx - std::max(win_start, lo_));
  }
};

// The query heads that share kv head `g` (GQA group), for keys/values at
// positions [0, n_ctx) of `layer` (the layer's slot in the blocks of its KV
// table, KvLayout::slot_of; seq.block_table is that table):
//   q:   [n_heads, head_dim]   (only heads g*r .. g*r+r-1 are read, r = n_heads/n_kv_heads)
//   out: [n_heads, head_dim]   (only those heads are written)
// scratch: attention_scratch_floats(r, head_dim) floats. The keys are
// visited in 16-key tiles fixed by absolute position with an online
// softmax (kernels/flash_attention.h), so the result for a position does not
// depend on how the prompt was chunked or on the block size.
void attention_group(const float* q, const KvStorage& kv, int layer, const AttnSeq& seq, int g,
                     const AttnShape& s, float* out, float* scratch);
// Scratch floats attention_group_block needs for `rows` = r * T query rows:
// the rows' running state, one K and one V tile, the tokens' tile masks
// (bf16: for shapes with AttnShape::bf16, whose kernel takes kTileBatch
// tiles at once and keeps bf16 copies of them).
size_t attention_scratch_floats(int rows, int head_dim, bool bf16 = false);

// T consecutive query tokens of one sequence at once (a prefill's query
// block): token i (q + i * ldq, out + i * ldo, rows as above) has context
// seq.n_ctx - (T - 1 - i), i.e. `seq` describes the last token. Each key and
// value tile is loaded (dequantized, rotated) once for all T tokens; each
// token runs the tile kernel's operations on the tiles it sees, with its own
// mask on the last ones, so results are bit-identical to T calls.
// For T > 1 the sequence's policy must hide no keys (sink_end >= win_start)
// and rotate none at attention time (else std::invalid_argument); a layer
// window is fine (each token masks its own keys, lo() of its context). All T
// tokens must share n_stored and own_k / own_v (a quantized cache: the block
// lies in one token group; token i reads the first n_ctx_i - n_stored own rows).
void attention_group_block(const float* q, size_t ldq, int T, const KvStorage& kv, int layer, const AttnSeq& seq,
                           int g, const AttnShape& s, float* out, size_t ldo, float* scratch);

// Reference for tests: K/V given contiguously as [n_ctx, n_kv_heads, head_dim];
// s.sinks in double like the scores.
void attention_reference(const float* q, const float* k, const float* v, int n_ctx,
                         const AttnShape& s, float* out);

}  // namespace kvs
