// AMX tile primitives for matmul_amx.cpp (and bench/bench_amx_anatomy.cpp,
// which times them; nothing else includes it): the
// tile configuration, tile loads and stores, the integer block products and
// the float chain that turns a block's integer sums into the accumulators.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/amx_tile_config.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2,popcnt,amx-tile,amx-int8")

namespace kvs::mm::amx_detail {

constexpr int KB = 32;  // blocks per K slice of one panel in scratch (even)
// A slice in scratch: per pair of blocks (2c, 2c + 1) their B levels
// [2][512] (contiguous, so one K = 64 tile takes both), then per block ws0,
// ws1, wm [3][16 floats].
constexpr int64_t kPairBytes = 2 * 512 + 2 * 192;
inline uint8_t* lev(uint8_t* slice, int64_t bb) { return slice + (bb >> 1) * kPairBytes + (bb & 1) * 512; }
inline const uint8_t* lev(const uint8_t* slice, int64_t bb) { return lev(const_cast<uint8_t*>(slice), bb); }
inline float* scl(uint8_t* slice, int64_t bb) {
  return reinterpret_cast<float*>(slice + (bb >> 1) * kPairBytes + 1024 + (bb & 1) * 192);
}
inline const float* scl(const uint8_t* slice, int64_t bb) { return scl(const_cast<uint8_t*>(slice), bb); }

// int32 per block in a C buffer ([16, 16]).
constexpr int64_t kCInts = 256;

// Which products a call runs. Two tile sets alternate block by block:
//   K32:   C0 A4 B6 / C1 A5 B7, A [16, 32], B [8, 64]
//   Pair:  C0 A4 B6 / C1 A5 B7, A [16, 64], B [16, 64]: two blocks in one
//          K = 64 product for up to 8 activation rows (below)
//   Bf16:  every tile [16, 64] (matmul_amx_bf16.cpp: C 0..3, A 4 5, B 6 7)
//   Super: every tile [16, 64] (matmul_amx_super.cpp: C 0..3, A 4 5, B 6 7)
enum class TileMode { K32, Pair, Bf16, Super };

// Loads the configuration; releases the tiles when the call ends, so no
// tile state outlives a kernel on a pool thread.
class TileScope {
 public:
  // m_rows (Bf16 only): rows of the C and A tiles, for fewer than 16
  // activation rows in all.
  explicit TileScope(TileMode mode, int m_rows = 16) {
    TileConfig c;
    for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
    if (mode == TileMode::Bf16)
      for (int t = 0; t < 6; ++t) c.rows[t] = uint8_t(m_rows);
    if (mode == TileMode::K32) c.colsb[4] = c.colsb[5] = 32, c.rows[6] = c.rows[7] = c.rows[3] = 8;  // 3: kNeg128
    // GCC 12's _tile_loadconfig names only 8 bytes as read, so the other
    // stores to c could be dropped: the whole struct is the operand here.
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// Tile loads and stores with the exact bytes they touch as memory operands
// (GCC 12's intrinsics name none, or clobber all memory, which keeps the
// accumulator array out of registers). The tile number is a literal.
#define KVS_TILE_LOAD(t, base, stride, bytes)                                               \
  __asm__ volatile("tileloadd (%1,%2,1), %%tmm" #t ::"m"(*(const uint8_t(*)[bytes])(base)), \
                   "r"(base), "r"(int64_t(stride)))
#define KVS_TILE_STORE(t, base)                                                                          \
  __asm__ volatile("tilestored %%tmm" #t ", (%1,%2,1)" : "=m"(*(int32_t(*)[256])(base)) : "r"(base), \
                   "r"(int64_t(64)))

// One block's product on a tile set: a its activation tile, b its signed
// levels (a scratch copy; levels read in place go through rot_product).
#define KVS_PRODUCT_K32(C, A, B, a, b) \
  KVS_TILE_LOAD(A, (a)->q, 32, 512);   \
  KVS_TILE_LOAD(B, (b), 64, 512);      \
  _tile_zero(C);                       \
  _tile_dpbssd(C, A, B)
// Two blocks' products into out ([2][kCInts] int32), both issued before the
// stores (a store waits for its product), with mid() run between them and
// last() after the second: the caller's float chain goes there, because
// tile loads and stores hold up the vector work issued after them.
template <class F, class G>
inline __attribute__((always_inline)) void products_split(const XTile* a, const uint8_t* b0, const uint8_t* b1,
                                                          int32_t* out, F&& mid, G&& last) {
  KVS_PRODUCT_K32(0, 4, 6, a, b0);
  mid();
  KVS_PRODUCT_K32(1, 5, 7, a + 1, b1);
  last();
  KVS_TILE_STORE(0, out);
  KVS_TILE_STORE(1, out + 256);
}
// Integer products of cnt (1 or 2) blocks into out ([cnt][kCInts] int32):
// one block on tile set `set`, two on both sets as products_split. a: the
// blocks' activation tiles; b0, b1: their signed levels. (The float chain
// that follows reads a buffer stored the round before.)
inline void products(int set, const XTile* a, const uint8_t* b0, const uint8_t* b1, int cnt, int32_t* out) {
  if (cnt == 2) {
    products_split(a, b0, b1, out, [] {}, [] {});
  } else if (set == 0) {
    KVS_PRODUCT_K32(0, 4, 6, a, b0);
    KVS_TILE_STORE(0, out);
  } else {
    KVS_PRODUCT_K32(1, 5, 7, a, b0);
    KVS_TILE_STORE(1, out);
  }
}

// The three-tile rotation of rot_rows (TileMode::K32, one block per
// product): block i's product goes to C tile i % 3 from the A/B pair i % 2
// (A 4 / B 6 or A 5 / B 7), and its store is issued a whole block later,
// once the product is done: a tile store keeps later loads (the float
// chain's) waiting until it has written, and a store that first waits for
// its product holds them for the product's latency too.
// With u8 levels (u = q + 128, read in place) the product also takes the
// activations against tile 3, a B tile of -128 (load_neg128): C then holds
// sum(a * u) - 128 * sum(a) = sum(a * q), the exact signed sum, and the
// float chain needs no correction.
alignas(64) inline constexpr int8_t kNeg128[1024] = {
#define KVS_N8 -128, -128, -128, -128, -128, -128, -128, -128
#define KVS_N64 KVS_N8, KVS_N8, KVS_N8, KVS_N8, KVS_N8, KVS_N8, KVS_N8, KVS_N8
    KVS_N64, KVS_N64, KVS_N64, KVS_N64, KVS_N64, KVS_N64, KVS_N64, KVS_N64,
    KVS_N64, KVS_N64, KVS_N64, KVS_N64, KVS_N64, KVS_N64, KVS_N64, KVS_N64
#undef KVS_N64
#undef KVS_N8
};
inline void load_neg128() { KVS_TILE_LOAD(3, kNeg128, 64, 512); }        // K32: [8, 64]
inline void load_neg128_pair() { KVS_TILE_LOAD(3, kNeg128, 64, 1024); }  // Pair: [16, 64]
// Block i's product (PAIR: pair i's, TileMode::Pair) on C tile i % 3 from
// the A/B pair i % 2; a: its A tile (XTile::q, or a pair tile), b: its
// levels. u8 levels: a second product against tile 3 makes the sums signed.
#define KVS_ROT(C, A, B)                                  \
  if (PAIR) {                                             \
    KVS_TILE_LOAD(A, a, 64, 1024);                        \
    KVS_TILE_LOAD(B, b, 64, 1024);                        \
  } else {                                                \
    KVS_TILE_LOAD(A, a, 32, 512);                         \
    KVS_TILE_LOAD(B, b, 64, 512);                         \
  }                                                       \
  _tile_zero(C);                                          \
  if (U8) {                                               \
    _tile_dpbsud(C, A, B);                                \
    _tile_dpbssd(C, A, 3);                                \
  } else {                                                \
    _tile_dpbssd(C, A, B);                                \
  }
template <bool PAIR, bool U8>
inline void rot_product(int64_t i, const void* a, const uint8_t* b) {
  switch (int(i % 6)) {
    case 0: KVS_ROT(0, 4, 6); break;
    case 1: KVS_ROT(1, 5, 7); break;
    case 2: KVS_ROT(2, 4, 6); break;
    case 3: KVS_ROT(0, 5, 7); break;
    case 4: KVS_ROT(1, 4, 6); break;
    default: KVS_ROT(2, 5, 7); break;
  }
}
#undef KVS_ROT
inline void rot_store(int64_t i, int32_t* out) {
  switch (int(i % 3)) {
    case 0: KVS_TILE_STORE(0, out); break;
    case 1: KVS_TILE_STORE(1, out); break;
    default: KVS_TILE_STORE(2, out); break;
  }
}

#undef KVS_PRODUCT_K32

// The float chain step of block bb for rows m < rows (all 16 when FULL):
// exactly block_step()'s operations on the tile's integer sums c ([rows]
// of 16 int32, signed). src gives the block's float scales (lanes = the
// panel's weight rows), loaded here, where they are used. Formats with a
// min (the K-quants) run per super-block instead (matmul_amx_super.cpp).
template <bool FULL, class Src>
inline void chain(const int32_t* c, Src src, int64_t bb, const XTile& x, int rows, __m512* acc) {
  const __m512 ws0 = src.ws0(bb);
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    const __m512 xd = _mm512_set1_ps(x.d[m]);
    const __m512i isum = _mm512_load_si512(c + 16 * m);
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(ws0, xd), acc[m]);
  }
}

// The next weight slice, requested a few lines per block: all of it at once
// stalled on the fill buffers.
struct Ahead {
  const uint8_t* p;  // first line
  int64_t lines;
  int64_t per = 0;  // lines per block (set by spread)
  void spread(int64_t kb) { per = (lines + kb - 1) / kb; }
  // M tiles [t0, t1)'s share of the lines among mt M tiles (spread() it
  // over their steps).
  Ahead part(int64_t t0, int64_t t1, int64_t mt) const {
    return Ahead{p + 64 * (t0 * lines / mt), t1 * lines / mt - t0 * lines / mt};
  }
  // M tile t's share of the lines among mt M tiles, spread over its steps.
  Ahead share(int64_t t, int64_t mt, int64_t steps) const {
    Ahead a = part(t, t + 1, mt);
    a.spread(steps);
    return a;
  }
  void at(int64_t bb) const {
    for (int64_t l = bb * per; l < std::min(lines, (bb + 1) * per); ++l)
      _mm_prefetch(reinterpret_cast<const char*>(p + 64 * l), _MM_HINT_T1);
  }
};

}  // namespace kvs::mm::amx_detail

KVS_TARGET_END()
