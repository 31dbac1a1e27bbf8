// AMX-INT8 tile kernels for Panel16 Q8_0 / Q4_0 / MXFP4 / Q4_K / Q5_K / Q6_K weights, run
// from n >= amx_min_rows(type) activation rows (kernels/amx_rows.h); smaller
// n, the file layout and every other format run the AVX-512 VNNI kernels.
//
// One tile product per 32-element block b gives the exact integer block dots
// of 16 activation rows x the 16 weight rows of a panel:
//   A [16, 32] s8  activation levels of rows 16t .. 16t+15 (XTile::q, laid
//                  out by the driver once per call: one contiguous tile)
//   B [8, 64] s8   weight levels in the tile's dword-group order, which is
//                  the Panel16 vector order: row k, dword r = elements
//                  4k..4k+3 of weight row r. A K slice of the panel is
//                  copied into scratch as signed levels q (not q + off), so
//                  the XBlock correction is not needed: sum(q_w * q_x) is the
//                  integer corr + sum(u * q_x) that block_step() computes.
//   C [16, 16] s32 tdpbssd(A, B): C[m][r] = isum of activation row 16t + m
//                  and weight row r
// C goes through a 1 KiB buffer into zmm registers, lane r = weight row r as
// in block_step(), and the float chain of matmul_internal.h runs per row m:
//   acc[m] = fma(float(C[m]), ws * xd_m, acc[m])   (+ fma(wm, xs_m, acc[m]))
// so the results are bit-identical to the VNNI kernels. The K-quants (Q4_K,
// Q5_K, Q6_K) sum whole super-blocks instead (matmul_amx_super.cpp).
//
// A product and its store cost the same for 2 rows as for 16, so up to 8
// rows (Q8_0, Q4_0, MXFP4, Q4_K) share one K = 64 product between two blocks: A
// rows 0..7 hold block 2c's levels and zeros, rows 8..15 zeros and block
// 2c+1's; B holds both blocks' levels. C rows 0..7 are then block 2c's
// sums, rows 8..15 block 2c+1's, each an exact integer as before.
//
// For n <= 16, Q8_0 reads the Panel16 levels in place (u = q + 128) with
// tdpbsud and a second product against a tile of -128, which leaves the
// same signed sums in C (rot_product).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/matmul_amx_tiles.h"
#include "kernels/matmul_avx512_unpack.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2,popcnt,amx-tile,amx-int8")

namespace {

using namespace avx512_detail;
using namespace amx_detail;

constexpr int kPairRows = 8;  // up to this many activation rows run two blocks per product

// Where a slice's B levels and float scales come from (passed by value: a
// pointer and an offset).
// The scratch copy: signed levels, float scales.
struct SliceSrc {
  static constexpr bool kU8 = false;
  const uint8_t* s;
  const uint8_t* lev(int64_t bb) const { return amx_detail::lev(s, bb); }
  __m512 ws0(int64_t bb) const { return _mm512_load_ps(scl(s, bb)); }
  __m512 wm(int64_t bb) const { return _mm512_load_ps(scl(s, bb) + 32); }
};
// Q8_0's Panel16 copy in place (u = q + 128, fp16 scales), from block kb0:
// where a slice serves a single M tile, reading it in place beats copying
// it (docs/PERFORMANCE.md); the tile paths that read it (rot_rows,
// pair_rows) make the sums signed with a second product (rot_product).
struct PanelSrc {
  static constexpr bool kU8 = true;
  const uint8_t* pan;
  int64_t kb0;
  const uint8_t* lev(int64_t bb) const { return Pk<GgmlType::Q8_0>::lev(pan, kb0 + bb); }
  __m512 ws0(int64_t bb) const { return Pk<GgmlType::Q8_0>::scale(pan, kb0 + bb); }
  __m512 wm(int64_t bb) const { return ws0(bb); }  // (no min)
};

// The accumulators of `rows` activation rows (all 16 when FULL) from y,
// or zero at the first slice; and back. At the first slice the y lines
// the tile ends by storing are requested first: a store that misses holds
// every later store behind it, the tile stores too (docs/PERFORMANCE.md).
template <bool FULL>
inline __attribute__((always_inline)) void load_acc(__m512* acc, int64_t kb0, int rows, const float* y, int64_t ldy,
                                                    __mmask16 valid) {
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    if (kb0 == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(y + m * ldy), _MM_HINT_T0);  // (prefetchw measured no better)
      acc[m] = _mm512_setzero_ps();
    } else {
      acc[m] = _mm512_maskz_loadu_ps(valid, y + m * ldy);
    }
  }
}
template <bool FULL>
inline __attribute__((always_inline)) void store_acc(const __m512* acc, int rows, float* y, int64_t ldy,
                                                     __mmask16 valid) {
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    _mm512_mask_storeu_ps(y + m * ldy, valid, acc[m]);
  }
}

// One M tile (activation rows of xt, `rows` of them real; y at its first
// row) against blocks [kb0, kb0 + kb) of one panel (src: their levels).
// The accumulators live in y between slices (exact round trip), as in the
// VNNI tiles. Products run a group of G (1 or 2) blocks ahead of the float
// chain: two paid where several M tiles share a slice, one where a single M
// tile runs right after the slice's copy (docs/PERFORMANCE.md). With two,
// each of a group's chains runs after one of the next group's products,
// before their stores: tile loads and stores hold up the vector work issued
// after them, and chains issued after both stores waited for the products.
template <bool FULL, int G, class Src>
inline __attribute__((always_inline)) void tile_rows(Src src, int64_t kb0, int64_t kb, const XTile* xt, int rows, float* y, int64_t ldy,
               __mmask16 valid, int32_t* cbuf, Ahead ahead) {
  static_assert(!Src::kU8, "levels read in place run in rot_rows / pair_rows");
  __m512 acc[16];
  load_acc<FULL>(acc, kb0, rows, y, ldy, valid);
  const XTile* x = xt + kb0;
  constexpr int64_t kC = kCInts;
  int32_t* const ring0 = cbuf;           // even groups' integers
  int32_t* const ring1 = cbuf + 2 * kC;  // odd groups'
  products(0, x, src.lev(0), src.lev(1), int(std::min<int64_t>(G, kb)), ring0);
  for (int64_t g = 0; g < kb; g += G) {  // no inner loop: the accumulators stay in registers
    const bool odd = (g / G) & 1;
    int32_t* const cur = odd ? ring1 : ring0;
    const int64_t nx = g + G;
    if (G == 2 && nx + 1 < kb) {  // two blocks now and two next: each block's chain after one product
      products_split(x + nx, src.lev(nx), src.lev(nx + 1), odd ? ring0 : ring1,
          [&]() __attribute__((always_inline)) { chain<FULL>(cur, src, g, x[g], rows, acc); },
          [&]() __attribute__((always_inline)) { chain<FULL>(cur + kC, src, g + 1, x[g + 1], rows, acc); });
      ahead.at(g);
      ahead.at(g + 1);
      continue;
    }
    if (nx < kb)
      products(!odd, x + nx, src.lev(nx), src.lev(nx + 1), int(std::min<int64_t>(G, kb - nx)),
                          odd ? ring0 : ring1);
    chain<FULL>(cur, src, g, x[g], rows, acc);
    ahead.at(g);
    if (G == 2 && g + 1 < kb) {
      chain<FULL>(cur + kC, src, g + 1, x[g + 1], rows, acc);
      ahead.at(g + 1);
    }
  }
  store_acc<FULL>(acc, rows, y, ldy, valid);
}

// tile_rows in the
// rotation of rot_product: block b's store is issued while block b + 1's
// product runs, then block b + 2's product, then block b's float chain, so
// no store waits for its product and the chain's loads wait only for a
// store whose data is ready. Same integer sums, same chain order: the same
// bits as tile_rows. Run for a single M tile (n <= 16: batched decode, the
// weights streaming from DRAM), where it is faster; with several M tiles
// tile_rows' two-block groups measured faster (docs/PERFORMANCE.md).
template <bool FULL, class Src>
inline __attribute__((always_inline)) void rot_rows(Src src, int64_t kb0, int64_t kb, const XTile* xt, int rows,
                                                    float* y, int64_t ldy, __mmask16 valid, int32_t* cbuf,
                                                    Ahead ahead) {
  constexpr bool U8 = Src::kU8;
  __m512 acc[16];
  load_acc<FULL>(acc, kb0, rows, y, ldy, valid);
  const XTile* x = xt + kb0;
  int32_t* const ring[3] = {cbuf, cbuf + 256, cbuf + 512};  // block b's sums at ring[b % 3]
  if (U8) load_neg128();
  rot_product<false, U8>(0, x[0].q, src.lev(0));
  if (kb > 1) rot_product<false, U8>(1, x[1].q, src.lev(1));
  rot_store(0, ring[0]);
  for (int64_t b = 0; b < kb; ++b) {  // no inner loop: the accumulators stay in registers
    if (b + 1 < kb) rot_store(b + 1, ring[(b + 1) % 3]);
    if (b + 2 < kb) rot_product<false, U8>(b + 2, x[b + 2].q, src.lev(b + 2));
    chain<FULL>(ring[b % 3], src, b, x[b], rows, acc);
    ahead.at(b);
  }
  store_acc<FULL>(acc, rows, y, ldy, valid);
}

// Up to kPairRows activation rows against one slice, a pair of blocks per
// product (TileMode::Pair); pa: the pairs' A tiles from block 0 ([nb / 2
// rounded up][16, 64] s8). An odd last block's pair has zero levels for
// its missing second block; its sums are not read.
template <class Src>
inline __attribute__((always_inline)) void pair_rows(Src src, int64_t kb0, int64_t kb, const XTile* xt, const int8_t* pa, int rows, float* y,
               int64_t ldy, __mmask16 valid, int32_t* cbuf, Ahead ahead) {
  constexpr bool U8 = Src::kU8;
  __m512 acc[16];
  load_acc<false>(acc, kb0, rows, y, ldy, valid);
  const XTile* x = xt + kb0;
  const int8_t* a = pa + kb0 / 2 * 1024;  // kb0 is even
  // Pairs rotate over three C tiles as in rot_rows: pair c's store is
  // issued while pair c + 1's product runs.
  int32_t* const ring[3] = {cbuf, cbuf + 256, cbuf + 512};  // pair c's sums at ring[c % 3]
  const int64_t np = (kb + 1) / 2;
  if (U8) load_neg128_pair();
  rot_product<true, U8>(0, a, src.lev(0));
  if (np > 1) rot_product<true, U8>(1, a + 1024, src.lev(2));
  rot_store(0, ring[0]);
  for (int64_t g = 0; g < kb; g += 2) {
    const int64_t c = g / 2;
    if (c + 1 < np) rot_store(c + 1, ring[(c + 1) % 3]);
    if (c + 2 < np) rot_product<true, U8>(c + 2, a + (c + 2) * 1024, src.lev(g + 4));
    const int k = int(c % 3);
    chain<false>(ring[k], src, g, x[g], rows, acc);
    ahead.at(g);
    if (g + 1 < kb) {
      chain<false>(ring[k] + 8 * 16, src, g + 1, x[g + 1], rows, acc);  // C rows 8..15
      ahead.at(g + 1);
    }
  }
  store_acc<false>(acc, rows, y, ldy, valid);
}

// Every M tile against one slice of the panel at weight row p0; the M
// tiles share the prefetch of the next slice. pa: the pair tiles when n <=
// kPairRows runs in pairs, else nullptr.
template <class Src>
void all_rows(Src src, int64_t kb0, int64_t kb, const XTile* xt, const int8_t* pa, int64_t nb,
              int64_t n, float* y, int64_t ldy, int64_t p0, __mmask16 valid, int32_t* cbuf, Ahead next) {
  const int64_t mt = (n + 15) / 16;
  for (int64_t t = 0; t < mt; ++t) {
    const XTile* x = xt + t * nb;
    float* yt = y + 16 * t * ldy + p0;
    const int64_t l0 = t * next.lines / mt, l1 = (t + 1) * next.lines / mt;
    Ahead a{next.p + 64 * l0, l1 - l0};
    a.spread(kb);
    const int rows = int(std::min<int64_t>(16, n - 16 * t));
    if (pa) pair_rows(src, kb0, kb, x, pa, rows, yt, ldy, valid, cbuf, a);
    else if (mt == 1 && rows == 16) rot_rows<true>(src, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
    else if (mt == 1) rot_rows<false>(src, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
    else if constexpr (Src::kU8) continue;  // (n <= 16: one M tile, handled above)
    else if (mt == 1 && rows == 16) tile_rows<true, 1>(src, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
    else if (mt == 1) tile_rows<false, 1>(src, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
    else if (rows == 16) tile_rows<true, 2>(src, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
    else tile_rows<false, 2>(src, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
  }
}

// Blocks [kb0, kb0 + kb) of one packed panel into the scratch slice with
// signed levels (Panel16 holds u = q + off; MXFP4's codes, looked up to u).
template <class P>
void fill_q(const uint8_t* pan, int64_t kb0, int64_t kb, uint8_t* dst) {
  const __m512i off = _mm512_set1_epi8(char(P::kOff));
  for (int64_t bb = 0; bb < kb; ++bb) {
    const uint8_t* l = P::lev(pan, kb0 + bb);
    uint8_t* o = lev(dst, bb);
    for (int k = 0; k < 8; ++k) _mm512_store_si512(o + 64 * k, _mm512_sub_epi8(P::vec(l, k), off));
    _mm512_store_ps(scl(dst, bb), P::scale(pan, kb0 + bb));
  }
}

// The pair A tiles of rows 0..7 (XTile rows; rows past n are zero) for
// every pair of blocks: dst [ceil(nb / 2)][16, 64] s8.
void make_pairs(const XTile* xt, int64_t nb, int8_t* dst) {
  for (int64_t c = 0; 2 * c < nb; ++c) {
    int8_t* a = dst + c * 1024;
    std::memset(a, 0, 1024);
    for (int m = 0; m < kPairRows; ++m) {
      std::memcpy(a + 64 * m, xt[2 * c].q[m], 32);
      if (2 * c + 1 < nb) std::memcpy(a + 64 * (8 + m) + 32, xt[2 * c + 1].q[m], 32);
    }
  }
}

// Activation rows in chunks whose XTiles stay in L2 while every panel of
// the task runs against them: each panel reads all of a chunk's XTiles, so
// a long prompt's would otherwise stream from L3 or DRAM once per 16
// weight rows. (Grouping panels too, so a group's weights come from L2 for
// the later chunks, measured no faster.)
// Every K slice of a panel also loads and stores one line of y per
// activation row, ldy floats apart. Where ldy is a multiple of 1 KiB (as
// unpadded gate and up projections' are) those lines share few cache
// sets, and past some rows they no longer stay cached from one slice to
// the next. So there a chunk's rows also span at most kYSpan bytes of y,
// but never fewer than four M tiles (each chunk streams the weights
// again); the engine pads its outputs off that grid and gets whole
// chunks. Up to kWholeTiles M tiles stay one chunk (splitting them cost
// more than it saved). Measured in docs/PERFORMANCE.md ("Per-op timer").
// K-quants get twice the XTile budget, met by parts of K rather than
// chunks of rows (gemm_amx_super): their slice copy unpacks super-blocks,
// which every chunk paid again (docs/PERFORMANCE.md).
constexpr int64_t kChunkBytes = 1 << 20, kChunkBytesK = 2 << 20, kYSpan = 2 << 20;
constexpr int64_t kWholeTiles = 8;

// How many chunks mt M tiles of nb blocks each run in (y rows ldy floats
// apart), chunk_bytes of XTiles each at most.
int64_t chunk_count(int64_t mt, int64_t nb, int64_t ldy, int64_t chunk_bytes) {
  const int64_t fit = std::max<int64_t>(4, chunk_bytes / (nb * int64_t(sizeof(XTile))));  // XTiles in L2
  if (mt <= std::min(fit, kWholeTiles)) return 1;
  const bool aliased = ldy * int64_t(sizeof(float)) % 1024 == 0;
  const int64_t span = aliased ? kYSpan / (16 * ldy * int64_t(sizeof(float))) : fit;  // M tiles
  const int64_t cap = std::clamp<int64_t>(span, 4, fit);
  return (mt + cap - 1) / cap;
}

// One panel at a time, K slice by K slice: fill the slice (DIRECT, Q8_0:
// not for a single M tile, which reads the panel in place), then every
// activation row against it. The next slice (of this panel or the next;
// panels are contiguous) is requested while this one's tiles run, up to
// `end`. r0 % 16 == 0.
template <bool DIRECT, class Fill>
void panels_rows(const WeightView& w, int64_t pbytes, int64_t r0, int64_t r1, const uint8_t* end, const XTile* xt,
                 int64_t n, float* y, int64_t ldy, Scratch scratch, Fill fill) {
  const int64_t nb = w.cols / kQBlock;
  uint8_t* slice = scratch.buf;                                                   // [KB / 2] pairs of kPairBytes
  int32_t* cbuf = reinterpret_cast<int32_t*>(scratch.buf + KB / 2 * kPairBytes);  // [2][2][kCInts] int32
  int8_t* pa = reinterpret_cast<int8_t*>(cbuf + 4 * kCInts);              // [ceil(nb / 2)][16, 64] s8
  const bool pairs = n <= kPairRows &&
                     (reinterpret_cast<uint8_t*>(pa) - scratch.buf) + (nb + 1) / 2 * 1024 <= int64_t(scratch.bytes);
  if (pairs) make_pairs(xt, nb, pa);
  const int8_t* p = pairs ? pa : nullptr;
  TileScope tiles(pairs ? TileMode::Pair : TileMode::K32);
  for (int64_t p0 = r0; p0 < r1; p0 += L) {
    const uint8_t* pan = w.packed + (p0 / L) * pbytes;
    const __mmask16 valid = lanes(r1 - p0);
    for (int64_t kb0 = 0; kb0 < nb; kb0 += KB) {
      const int64_t kb = std::min<int64_t>(KB, nb - kb0);  // KB, kb0: whole K-quant super-blocks
      const uint8_t* from = pan + (kb0 + kb) * pbytes / nb;
      const uint8_t* to = std::min(end, from + KB * pbytes / nb);
      const Ahead next{from, std::max<int64_t>(0, (to - from) / 64)};
      if constexpr (DIRECT) {
        if (n <= 16) {
          all_rows(PanelSrc{pan, kb0}, kb0, kb, xt, p, nb, n, y, ldy, p0, valid, cbuf, next);
          continue;
        }
      }
      fill(pan, kb0, kb, slice);
      all_rows(SliceSrc{slice}, kb0, kb, xt, p, nb, n, y, ldy, p0, valid, cbuf, next);
    }
  }
}

template <bool DIRECT, class Fill>
void gemm_amx(const WeightView& w, int64_t pbytes, int64_t r0, int64_t r1, const XTile* xt, int64_t n,
              float* y, int64_t ldy, Scratch scratch, Fill fill) {
  const int64_t nb = w.cols / kQBlock;
  const int64_t mt = (n + 15) / 16, chunks = chunk_count(mt, nb, ldy, kChunkBytes);
  const uint8_t* end = w.packed + ((r1 + L - 1) / L) * pbytes;
  for (int64_t c = 0; c < chunks; ++c) {  // M tiles [t0, t1)
    const int64_t t0 = c * mt / chunks, t1 = (c + 1) * mt / chunks, i0 = 16 * t0;
    panels_rows<DIRECT>(w, pbytes, r0, r1, end, xt + t0 * nb, std::min(16 * t1, n) - i0, y + i0 * ldy,
                                    ldy, scratch, fill);
  }
}

// K-quants: chunks of M tiles only where y's rows alias, and the XTile
// budget met by parts of K instead: each part streams and unpacks every
// weight slice once, where M chunks repeated both. Parts are whole slices
// of two super-blocks; y accumulates across them in K order (the same
// bits).
void gemm_amx_super(const WeightView& w, int64_t r0, int64_t r1, const XTile* xt, int64_t n, float* y, int64_t ldy,
                    Scratch scratch) {
  const int64_t nb = w.cols / kQBlock, nsb = nb / kSuperBlocks, pbytes = nsb * super_unit_bytes(w.type);
  const int64_t mt = (n + 15) / 16, chunks = chunk_count(mt, nb, ldy, INT64_MAX / 2);
  const uint8_t* end = w.packed + ((r1 + L - 1) / L) * pbytes;
  for (int64_t c = 0; c < chunks; ++c) {  // M tiles [t0, t1)
    const int64_t t0 = c * mt / chunks, t1 = (c + 1) * mt / chunks, i0 = 16 * t0, rows = std::min(16 * t1, n) - i0;
    const int64_t bytes = (t1 - t0) * nb * int64_t(sizeof(XTile));
    const int64_t parts = rows <= kKQuantFewRows ? 1 : std::min((bytes + kChunkBytesK - 1) / kChunkBytesK, (nsb + 1) / 2);
    for (int64_t p = 0; p < parts; ++p) {  // super-blocks [s0, s1)
      const int64_t s0 = p * nsb / parts / 2 * 2, s1 = p + 1 == parts ? nsb : (p + 1) * nsb / parts / 2 * 2;
      panels_rows_super(w, r0, r1, end, xt + t0 * nb, rows, y + i0 * ldy, ldy, scratch, s0, s1);
    }
  }
}

// Rows 16t .. 16t+15 of xq ([n, nb]) for t in [t0, t1) as XTiles, rows past
// n zero (K-quants: as XSuper).
void tile_x_amx(const XBlock* xq, int64_t n, int64_t nb, int64_t t0, int64_t t1, QFormat f, XTile* out) {
  if (f.super) return tile_x_super(xq, n, nb, t0, t1, f.has_min, out);
  const bool has_min = f.has_min;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      XTile& o = out[t * nb + b];
      for (int m = 0; m < 16; ++m) {
        const int64_t i = 16 * t + m;
        const __m256i q = i < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i * nb + b].q))
                                : _mm256_setzero_si256();
        _mm256_store_si256(reinterpret_cast<__m256i*>(o.q[m]), q);
        o.d[m] = i < n ? xq[i * nb + b].d : 0.0f;
        o.s[m] = has_min && i < n ? xq[i * nb + b].s : 0.0f;
      }
    }
}

void quant_rows_amx(const WeightView& w, int64_t r0, int64_t r1, const XTile* xt, int64_t n, float* y,
                    int64_t ldy, Scratch s) {
  const int64_t nb = w.cols / kQBlock;
  switch (w.type) {  // the driver sends amx_tiles_apply() weights only
    case GgmlType::Q8_0:
      return gemm_amx<true>(w, Pk<GgmlType::Q8_0>::panel_bytes(nb), r0, r1, xt, n, y, ldy, s,
                                          fill_q<Pk<GgmlType::Q8_0>>);
    case GgmlType::Q4_0:
      return gemm_amx<false>(w, Pk<GgmlType::Q4_0>::panel_bytes(nb), r0, r1, xt, n, y, ldy, s,
                                           fill_q<Pk<GgmlType::Q4_0>>);
    case GgmlType::MXFP4:
      return gemm_amx<false>(w, Pk<GgmlType::MXFP4>::panel_bytes(nb), r0, r1, xt, n, y, ldy, s,
                                           fill_q<Pk<GgmlType::MXFP4>>);
    default:  // Q4_K, Q5_K, Q6_K
      return gemm_amx_super(w, r0, r1, xt, n, y, ldy, s);
  }
}

}  // namespace

const IsaKernels& amx_kernels() {
  static const IsaKernels k = [] {
    IsaKernels a = avx512_kernels();  // the rest: the AVX-512 kernels
    a.tile_x = tile_x_amx;
    a.quant_rows_tiles = quant_rows_amx;
    a.bf16_x = bf16_x_amx;
    a.bf16_rows = bf16_rows_amx;
    return a;
  }();
  return k;
}

KVS_TARGET_END()

}  // namespace kvs::mm
