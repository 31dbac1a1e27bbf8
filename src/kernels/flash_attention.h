// The attention algorithm, one key tile at a time (flash-attention style):
// online softmax over fixed 16-key tiles, no score matrix in memory. This
// header is its definition; the scalar kernel is that definition in code and
// the SIMD kernels run the same IEEE operations in the same order.
//
// For one row (a query token's head) with scaled query qs = q * query_factor:
//   m = -inf, l = 0, o[d] = 0
//   for each key tile, in position order (a tile is positions [16j, 16j + 16);
//   only tiles holding a key the row sees; vis_k: key k of the tile is seen):
//     s_k   = vis_k ? score(the fma chain acc = fma(qs[d], K_k[d], acc),
//                     d = 0..hd-1, from acc = 0) : -inf
//     mn    = max(m, max_k s_k)
//     alpha = exp2n(m - mn)
//     p_k   = vis_k ? exp2n(s_k - mn) : 0
//     l     = fma(l, alpha, tree16(p))
//     o[d]  = o[d] * alpha, then o[d] = fma(p_k, V_k[d], o[d]) for each seen k in order
//     m     = mn
//   with learned sinks (gpt-oss: one logit z per head, no value), once
//   after the last tile:
//     zs    = z * log2 e
//     mn    = max(m, zs)
//     alpha = exp2n(m - mn)
//     l     = fma(l, alpha, exp2n(zs - mn))
//     o[d]  = o[d] * alpha
//   out[d] = o[d] * (1 / l)
// where exp2n is exp2n_scalar() below and tree16 sums lanes k and k + 8,
// then k and k + 4, k + 2, k + 1. Without soft-capping, query_factor =
// scale * log2 e and score(acc) = acc. With a cap (Gemma 2: scores become
// cap * tanh(scale * q.k / cap)), query_factor = scale * (2 / cap) and
//   score(acc) = C1 - C2 / (1 + exp_poly(acc)),  C1 = cap * log2 e, C2 = 2 cap log2 e
// (exp_poly.h's exp; cap * tanh(y) = cap - 2 cap / (1 + e^(2y))), which is the
// capped score in log2 units. A sink is an extra softmax term, not a key:
// it depends on nothing but its head, so it enters once per row at the end
// and cannot change what the tiles computed.
//
// Why the result cannot depend on batching or chunking: the tiles are fixed
// by absolute position, so a row visits the same tiles with the same masks
// whatever query block it is in; a row that sees none of a tile's keys
// would be left exactly as it was (alpha = exp2n(0) = 1, p = 0), and the
// SIMD kernels keep it so with masked updates; every operation is per row.
// Hence a query block gives each token the bits of a lone token (T = 1), and
// on f32/f16/bf16 tiles every ISA gives the scalar kernel's bits.
//
// The bf16 variant (AttnShape::bf16, models loaded with MatmulPrecision::Bf16;
// AMX-BF16 only, flash_amx_bf16.cpp) runs both products on bf16 tiles and
// keeps the softmax above in fp32:
//   s_k  = the tile product of bf16(qs) and bf16(K_k) over d (32 d per
//          instruction, the instructions in order of d; within one, the
//          tile unit's own accumulation, which is no sequential fp32 chain
//          in any order tried, so no vector path can give these bits)
//   o[d] = o[d] * alpha (skipped where alpha = 1: no bit changes), then the
//          tile product of bf16(p_k) and bf16(V_k[d]) over the tile's 16 keys
//          added into o[d] (p_k = 0 where unseen; values clamped to finite
//          bf16, so a row that sees none of the tile's keys adds +0 with
//          alpha = 1 and keeps its o)
// (bf16() rounds to nearest even and flushes denormals). Every operation is
// still per row and tiles are still fixed by position, so batching and
// chunking change no bit; the bits differ from the fp32 kernels' (within
// bf16 rounding, docs/PERFORMANCE.md has the perplexity cost). One
// exception, below any output that matters: a row whose running sum has
// underflowed to -0 or a denormal, in a query block, becomes +0 in a tile
// it does not see and another row does (the tiles flush denormals and add
// +0 to -0), where alone it would not visit that tile.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace kvs::attn {

constexpr int kTile = 16;  // keys per tile; tiles start at multiples of it
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kExp2Lo = -100.0f;  // exp2n's clamp: results stay normal floats
// The bf16 kernel's lazy maximum (flash_rows_impl.h's softmax): how far, in
// log2 units, a score may pass a row's reference before it moves.
constexpr float kLazyMaxLog2 = 8.0f;
// 2^f for f in [-0.5, 0.5], highest degree first (relative error < 2e-7).
constexpr float kExp2C[7] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                             5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f, 1.0f};

// 2^x for x <= 0: x clamped to kExp2Lo (a NaN becomes kExp2Lo, as vmaxps does),
// n = nearest integer (ties to even), f = x - n, Horner polynomial, times 2^n.
inline float exp2n_scalar(float x) {
  x = x > kExp2Lo ? x : kExp2Lo;
  const float n = std::nearbyint(x);
  const float f = x - n;
  float y = kExp2C[0];
  for (int i = 1; i < 7; ++i) y = std::fma(y, f, kExp2C[i]);
  return std::ldexp(y, int(n));
}

inline float tree16_scalar(const float* p) {
  float a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) a[i] = p[i] + p[i + 8];
  for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; ++i) c[i] = b[i] + b[i + 2];
  return c[0] + c[1];
}

// One query block's rows for one kv group: token i's r heads are
// q + i * ldq ([r, hd], head after head); row i * r + j is token i, head j.
struct FlashQuery {
  const float* q = nullptr;
  size_t ldq = 0;
  int T = 1, r = 1, hd = 0;
  float scale = 1.0f;
  float softcap = 0.0f;  // > 0: scores soft-capped (above); 0: none
  const float* sinks = nullptr;  // [r] the heads' sink logits (natural log units), or null: none
  int rows() const { return T * r; }
  float query_factor() const { return softcap > 0.0f ? scale * (2.0f / softcap) : scale * kLog2e; }
  float cap_c1() const { return softcap * kLog2e; }
  float cap_c2() const { return 2.0f * softcap * kLog2e; }
};

// A kernel keeps each row's state (scaled query, o, m, l) in `state`
// (flash_state_floats, 64-byte aligned) from begin to finish.
//   tile:  k, v  [kTile, hd] rows of the tile's keys and values (rows no
//          token sees may hold anything finite); vis [T]: bit k set when
//          token i sees key k, nullptr when every token sees all 16.
//   tiles: (null where a kernel has none) n <= kTileBatch tiles at once,
//          the next ones in position order: k, v [n, kTile, hd], vis[j]
//          as tile()'s for tile j. The same bits as n tile() calls would
//          give, where a kernel has both.
//   finish: out + i * ldo: token i's [r, hd] (the sinks applied first).
struct FlashKernel {
  void (*begin)(const FlashQuery& fq, float* state);
  void (*tile)(const FlashQuery& fq, float* state, const float* k, const float* v, const uint16_t* vis);
  void (*finish)(const FlashQuery& fq, const float* state, float* out, size_t ldo);
  void (*tiles)(const FlashQuery& fq, float* state, int n, const float* k, const float* v,
                const uint16_t* const* vis) = nullptr;
};

// Key tiles a kernel's tiles() takes at once (the bf16 kernel keeps a row
// group's outputs in tile registers across them).
constexpr int kTileBatch = 32;

// The bf16 kernel's work after the rows' state, for kTileBatch tiles: bf16
// keys [16, hd rounded up to 32] and transposed values [hd, 16] per tile,
// per tile its P^T [8, 32] bf16 and alpha [16], two rounds of four score
// tiles [16, 16] f32, per tile a flag.
inline size_t flash_work_floats(int hd) {
  const size_t hd32 = size_t(hd + 31) / 32 * 32;
  return size_t(kTileBatch) * (8 * hd32 + 8 * size_t(hd) + 128 + 16 + 1) + 2048;
}

// Enough state floats for any kernel (bf16: the bf16 kernel too): rows
// rounded up to 16 lanes.
inline size_t flash_state_floats(int rows, int hd, bool bf16 = false) {
  const size_t lanes = size_t(rows + 15) / 16 * 16;
  return 2 * lanes * size_t(hd) + 2 * lanes + (bf16 ? flash_work_floats(hd) : 0);
}

const FlashKernel& flash_kernel_scalar();
const FlashKernel& flash_kernel_avx2();    // needs AVX2 + FMA
const FlashKernel& flash_kernel_avx512();  // needs AVX-512F
const FlashKernel& flash_kernel();         // for active_isa()
// The bf16 variant: needs amx_bf16_active() and hd % 16 == 0.
const FlashKernel& flash_kernel_amx_bf16();
inline bool flash_bf16_fits(int hd) { return hd % 16 == 0; }

}  // namespace kvs::attn
