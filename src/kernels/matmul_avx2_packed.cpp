// AVX2 kernels for Panel8-packed Q8_0 / Q4_0 / MXFP4 / Q4_K / Q5_K / Q6_K weights
// (kernels/weight_pack.h). Same arithmetic as matmul_avx2.cpp, bit for bit
// (the same block_step on the same levels and scales); only where the weight
// vectors come from changes: one aligned 32-B load per vector from the
// packed panel instead of 8 row loads, a transpose and a scale gather.
//
// n = 1 (decode) streams MP panels at once, front to back; a few rows
// (batched decode) run straight from each panel too; more rows unpack K
// slices into the scratch layout and run the shared GEMM tiles.
#include <immintrin.h>

#include <cstdint>

#include "kernels/decode_variant.h"
#include "kernels/matmul_avx2_block.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx2,fma,f16c,bmi,bmi2,popcnt")

namespace {

using namespace avx2_detail;
constexpr int L = 8;  // rows per panel
// Up to this many activation rows go straight from the panels
// (few_rows_packed), which unpacks a block once per four rows: cheap for
// Q4_0 / Q8_0, dearer for the K-quants with their per-block scales, so they
// switch to the GEMM path sooner (docs/PERFORMANCE.md has the measurements).
template <class P>
constexpr int64_t few_rows_limit() { return P::kBlocks == 1 ? 32 : 16; }

inline __m256 half8(const uint8_t* p) {  // 8 fp16 -> float
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i s8x8i(const uint8_t* p) {  // 8 signed bytes -> int32
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i ld32(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }

// Q4_0 (Q4 = true) / Q8_0 pair units; a unit here is one 32-element block.
template <bool Q4>
struct P8Pair {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = false, kSigned = !Q4, kNibble = Q4;
  static constexpr int64_t LB = Q4 ? 16 * L : 32 * L;  // level bytes per block
  static constexpr int64_t UB = 2 * LB + 4 * L;        // bytes per pair unit
  static constexpr int64_t kStride = UB / 2;           // bytes per unit, on average
  static int64_t panel_bytes(int64_t cols) { return (cols / kQBlock + 1) / 2 * UB; }
  // Block b's levels (8 vectors of 32 B) and its 8 scales as floats.
  static inline const uint8_t* levels(const uint8_t* pan, int64_t b) { return pan + (b >> 1) * UB + (b & 1) * LB; }
  static inline __m256 scales(const uint8_t* pan, int64_t b) { return half8(pan + (b >> 1) * UB + 2 * LB + (b & 1) * 2 * L); }
  template <class F>
  static inline void unit(const uint8_t* pan, int64_t b, F&& f) {
    const uint8_t* pu = pan + (b >> 1) * UB;
    const uint8_t* l = pu + (b & 1) * LB;
    const __m256 ws = half8(pu + 2 * LB + (b & 1) * 2 * L);
    __m256i W[8];
    if (Q4) {
      const __m256i m4 = _mm256_set1_epi8(0x0F);
      for (int k = 0; k < 4; ++k) {
        const __m256i g = ld32(l + 32 * k);
        W[k] = _mm256_and_si256(g, m4);
        W[k + 4] = _mm256_and_si256(_mm256_srli_epi16(g, 4), m4);
      }
    } else {
      for (int k = 0; k < 8; ++k) W[k] = ld32(l + 32 * k);
    }
    f(0, W, ws, ws, ws);
  }
};

// MXFP4 quad units (4 blocks, then their 4 x 8 exponent bytes); a unit
// here is one 32-element block. The codes are looked up to u = value + 12.
struct P8Mx {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = false, kSigned = false, kSmall = true;
  static constexpr int64_t LB = 16 * L;         // level bytes per block
  static constexpr int64_t UB = 4 * (LB + L);   // bytes per quad unit
  static constexpr int64_t kStride = UB / 4;    // bytes per block, on average
  static int64_t panel_bytes(int64_t cols) { return (cols / kQBlock + 3) / 4 * UB; }
  template <class F>
  static inline void unit(const uint8_t* pan, int64_t b, F&& f) {
    const uint8_t* pu = pan + (b >> 2) * UB;
    const uint8_t* l = pu + (b & 3) * LB;
    const __m128i e = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(pu + 4 * LB + (b & 3) * L));
    const __m256 ws = e8m0_half_ps(_mm256_cvtepu8_epi32(e));
    const __m256i m4 = _mm256_set1_epi8(0x0F), tbl = mxfp4_table();
    __m256i W[8];
    for (int k = 0; k < 4; ++k) {
      const __m256i g = ld32(l + 32 * k);
      W[k] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(g, m4));
      W[k + 4] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(g, 4), m4));
    }
    f(0, W, ws, ws, ws);
  }
};

// One Q4_K (FIVE: Q5_K) super-block of 8 rows: the scales and mins arrive
// decoded, and pass to kblock as the file path's UnpackQK passes them
// (int32 lanes, and d / dmin as each lane's fp16 pair). Q5_K's unit adds
// the qh vectors, whose bit j becomes bit 4 of block j's levels.
template <bool FIVE>
struct P8QK {
  static constexpr int kBlocks = 8;
  static constexpr bool kSuper = true, kMin = true, kSigned = false, kNibble = !FIVE, kSmall = FIVE;
  static constexpr int64_t UB = (FIVE ? 180 : 148) * L, kStride = UB;
  static int64_t panel_bytes(int64_t cols) { return cols / QK_K * UB; }
  template <class F>
  static inline void unit(const uint8_t* pan, int64_t u, F&& f) {
    const uint8_t* p = pan + u * UB;
    const __m256i dd = _mm256_or_si256(_mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 128 * L))),
                                       _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 130 * L))), 16));
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    // Levels (and qh) are loaded per block, not per pair: AVX2 has 16
    // registers, and holding a pair's 8 vectors next to W[8] spilled.
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const uint8_t* v = p + (8 * (j >> 1)) * 4 * L;
      const __m256 sc = _mm256_castsi256_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 132 * L + L * j))));
      const __m256 mn = _mm256_castsi256_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 140 * L + L * j))));
      __m256i W[8];
      for (int k = 0; k < 8; ++k) {
        const __m256i g = ld32(v + k * 4 * L);
        W[k] = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(g, 4) : g, m4);
        if constexpr (FIVE) {
          const __m256i qh = ld32(p + 148 * L + k * 4 * L);
          const __m256i hb = j <= 4 ? _mm256_slli_epi32(qh, 4 - j) : _mm256_srli_epi32(qh, j - 4);
          W[k] = _mm256_or_si256(W[k], _mm256_and_si256(hb, b4));
        }
      }
      f(j, W, sc, mn, _mm256_castsi256_ps(dd));
    }
  }
};
using P8Q4K = P8QK<false>;
using P8Q5K = P8QK<true>;

// One Q6_K super-block of 8 rows (two halves of 128 elements).
struct P8Q6K {
  static constexpr int kBlocks = 8;
  static constexpr bool kSuper = true, kMin = false, kSigned = false;
  static constexpr int64_t UB = 212 * L, kStride = UB;
  static int64_t panel_bytes(int64_t cols) { return cols / QK_K * UB; }
  template <class F>
  static inline void unit(const uint8_t* pan, int64_t u, F&& f) {
    const uint8_t* p = pan + u * UB;
    const __m256 d = half8(p + 208 * L);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
#pragma GCC unroll 8
    for (int t8 = 0; t8 < 8; ++t8) {  // block t8: half t8 / 4, quarter uu of that half
      const int chunk = t8 >> 2, uu = t8 & 3;
      const uint8_t* lq = p + (16 * chunk + 8 * (uu & 1)) * 4 * L;
      const uint8_t* hq = p + 128 * L + 8 * chunk * 4 * L;
      __m256i W[8];
      for (int k = 0; k < 8; ++k) {  // loaded per block for the same reason as Q4_K
        const __m256i ql = ld32(lq + k * 4 * L);
        const __m256i lo = _mm256_and_si256(uu >> 1 ? _mm256_srli_epi16(ql, 4) : ql, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(ld32(hq + k * 4 * L), 2 * uu), m3);
        W[k] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
      }
      // The halves' int8 scales as int32 lanes, then d (kblock).
      const __m256 s0 = _mm256_castsi256_ps(s8x8i(p + 192 * L + L * (2 * t8)));
      const __m256 s1 = _mm256_castsi256_ps(s8x8i(p + 192 * L + L * (2 * t8 + 1)));
      f(t8, W, s0, s1, d);
    }
  }
};

// MP panels at once: MP independent memory streams and float chains. Each
// unit prefetches the cache lines that start in its stretch of the stream
// `pf` bytes ahead, so every line is asked for once. Without software
// prefetch the K-quant streams stalled on DRAM (perf: most samples on the
// level loads); the best distance and MP depend on the CPU (decode_variant.h).
template <class P, int MP>
inline void matvec_panels(const uint8_t* pan0, int64_t pbytes, int64_t units, const XBlock* xq, float* y,
                          int nvalid_last, int64_t pf) {
  __m256 acc[MP];
  KSum S[MP];  // K-quants: super-block sums (kblock)
  for (int m = 0; m < MP; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t u = 0; u < units; ++u) {
    const XBlock* xb = xq + u * P::kBlocks;
    if (pf > 0) {
      const int64_t lo = (u * P::kStride + pf + 63) & ~int64_t(63), hi = (u + 1) * P::kStride + pf;
      for (int64_t o = lo; o < hi && o < pbytes; o += 64)
        for (int m = 0; m < MP; ++m) _mm_prefetch(reinterpret_cast<const char*>(pan0 + m * pbytes + o), _MM_HINT_T0);
    }
    for (int m = 0; m < MP; ++m)
      P::unit(pan0 + m * pbytes, u, [&](int j, const __m256i* W, __m256 ws0, __m256 ws1, __m256 wm) {
        acc[m] = kblock<P::kSuper, P::kMin, P::kSigned, kLevelBits<P>>(W, ws0, ws1, wm, xb[j], j, S[m], acc[m]);
      });
  }
  for (int m = 0; m + 1 < MP; ++m) _mm256_storeu_ps(y + m * L, acc[m]);
  _mm256_maskstore_ps(y + (MP - 1) * L, lane_mask(nvalid_last), acc[MP - 1]);
}

template <class P>
void matvec_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, float* y) {
  const int64_t pbytes = P::panel_bytes(w.cols), units = w.cols / kQBlock / P::kBlocks;
  const DecodeVariant v = decode_variant(w.type);
  const int64_t pf = v.prefetch;
  auto last = [&](int64_t p0, int mp) { return int(r1 - p0 - (mp - 1) * L < L ? r1 - p0 - (mp - 1) * L : L); };
  int64_t p0 = r0;
  if (v.panels >= 4)
    for (; p0 + 3 * L < r1; p0 += 4 * L)
      matvec_panels<P, 4>(w.packed + (p0 / L) * pbytes, pbytes, units, xq, y + p0, last(p0, 4), pf);
  if (v.panels >= 2)
    for (; p0 + L < r1; p0 += 2 * L)
      matvec_panels<P, 2>(w.packed + (p0 / L) * pbytes, pbytes, units, xq, y + p0, last(p0, 2), pf);
  for (; p0 < r1; p0 += L)
    matvec_panels<P, 1>(w.packed + (p0 / L) * pbytes, pbytes, units, xq, y + p0, last(p0, 1), pf);
}

// A few activation rows (a few sequences decoding together): straight from
// the panel like the decode path, each block's weights unpacked once into
// registers for all RT rows. The GEMM path's unpacking to scratch and
// reloading cost more than it saved at this size.
template <class P, int RT>
inline void rows_panel(const uint8_t* pan, int64_t pbytes, int64_t units, const XBlock* xq, int64_t nb, float* y,
                       int64_t ldy, __m256i mask, int64_t pf) {
  __m256 acc[RT];
  KSum S[RT];  // K-quants: super-block sums (kblock)
  for (int i = 0; i < RT; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t u = 0; u < units; ++u) {
    if (pf > 0) {
      const int64_t lo = (u * P::kStride + pf + 63) & ~int64_t(63), hi = (u + 1) * P::kStride + pf;
      for (int64_t o = lo; o < hi && o < pbytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(pan + o), _MM_HINT_T0);
    }
    if constexpr (P::kSigned && !P::kSuper && !P::kMin && kLevelBits<P> == 8 && P::kBlocks == 1) {
      // Q8_0: |W| once per weight vector for all RT rows (signed_block_rows).
      const XBlock* xb[RT];
      for (int i = 0; i < RT; ++i) xb[i] = &xq[i * nb + u];
      signed_block_rows<RT>(P::levels(pan, u), P::scales(pan, u), xb, acc);
      continue;
    }
    P::unit(pan, u, [&](int j, const __m256i* W, __m256 ws0, __m256 ws1, __m256 wm) {
      for (int i = 0; i < RT; ++i)
        acc[i] = kblock<P::kSuper, P::kMin, P::kSigned, kLevelBits<P>>(W, ws0, ws1, wm, xq[i * nb + u * P::kBlocks + j],
                                                                       j, S[i], acc[i]);
    });
  }
  for (int i = 0; i < RT; ++i) _mm256_maskstore_ps(y + i * ldy, mask, acc[i]);
}

template <class P>
void few_rows_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n, float* y,
                     int64_t ldy) {
  const int64_t nb = w.cols / kQBlock, pbytes = P::panel_bytes(w.cols), units = nb / P::kBlocks;
  const int64_t pf = decode_variant(w.type).prefetch;
  for (int64_t p0 = r0; p0 < r1; p0 += L) {
    const uint8_t* pan = w.packed + (p0 / L) * pbytes;
    const __m256i mask = lane_mask(int(r1 - p0 < L ? r1 - p0 : L));
    // The panel stays in L1/L2 while each group of rows passes over it.
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
      const XBlock* x = xq + i0 * nb;
      float* yo = y + i0 * ldy + p0;
      switch (n - i0 < 4 ? n - i0 : 4) {
        case 1: rows_panel<P, 1>(pan, pbytes, units, x, nb, yo, ldy, mask, pf); break;
        case 2: rows_panel<P, 2>(pan, pbytes, units, x, nb, yo, ldy, mask, pf); break;
        case 3: rows_panel<P, 3>(pan, pbytes, units, x, nb, yo, ldy, mask, pf); break;
        default: rows_panel<P, 4>(pan, pbytes, units, x, nb, yo, ldy, mask, pf); break;
      }
    }
  }
}

template <class P>
void gemm_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n, float* y,
                 int64_t ldy, Scratch scratch) {
  const int64_t nb = w.cols / kQBlock, pbytes = P::panel_bytes(w.cols);
  uint8_t* slice = scratch.buf;  // [KB blocks][352 B], 64-B aligned
  // K slices outermost: the activations' slice stays in L2 while every
  // panel of the task passes over it (panel-major re-read all of X per
  // panel, from L3 for wide matrices). The accumulators wait in y between
  // slices, an exact round trip.
  for (int64_t kb0 = 0; kb0 < nb; kb0 += KB) {
    const int64_t kb = nb - kb0 < KB ? nb - kb0 : KB;
    for (int64_t p0 = r0; p0 < r1; p0 += L) {
      const uint8_t* pan = w.packed + (p0 / L) * pbytes;
      const __m256i mask = lane_mask(int(r1 - p0 < L ? r1 - p0 : L));
      for (int64_t bb = 0; bb < kb; bb += P::kBlocks)
        unpack_to_scratch<P>(pan, (kb0 + bb) / P::kBlocks, slice + bb * kPanelBlockBytes);
      // The next panel's part of this K slice is fetched while the tiles
      // run, a few lines per tile: its unpack would otherwise wait on
      // memory for each line (every panel is a new stream to the hardware
      // prefetcher), and all lines at once stall on the miss queue.
      const uint8_t* next = p0 + L < r1 ? pan + pbytes + (kb0 / P::kBlocks) * P::kStride : nullptr;
      const int64_t next_lines = (kb / P::kBlocks * P::kStride + 63) / 64;
      const int64_t per_tile = next_lines / (n / R > 0 ? n / R : 1) + 1;
      int64_t line = 0;
      int64_t i0 = 0;
      for (; i0 + R <= n; i0 += R) {
        for (int64_t e = line + per_tile; next && line < e && line < next_lines; ++line)
          _mm_prefetch(reinterpret_cast<const char*>(next + 64 * line), _MM_HINT_T0);
        tile_from_scratch<R, P>(slice, kb0, kb, xq, nb, i0, y, ldy, p0, mask);
      }
      for (; i0 < n; ++i0) tile_from_scratch<1, P>(slice, kb0, kb, xq, nb, i0, y, ldy, p0, mask);
    }
  }
}

template <class P>
void run_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n, float* y,
                int64_t ldy, Scratch s) {
  if (n == 1) matvec_packed<P>(w, r0, r1, xq, y);
  else if (n <= few_rows_limit<P>()) few_rows_packed<P>(w, r0, r1, xq, n, y, ldy);
  else gemm_packed<P>(w, r0, r1, xq, n, y, ldy, s);
}

}  // namespace

void quant_rows_avx2_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
                            float* y, int64_t ldy, Scratch s) {
  switch (w.type) {  // packable() admits exactly these
    case GgmlType::Q4_0: return run_packed<P8Pair<true>>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q8_0: return run_packed<P8Pair<false>>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q4_K: return run_packed<P8Q4K>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q5_K: return run_packed<P8Q5K>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::MXFP4: return run_packed<P8Mx>(w, r0, r1, xq, n, y, ldy, s);
    default: return run_packed<P8Q6K>(w, r0, r1, xq, n, y, ldy, s);
  }
}

KVS_TARGET_END()

}  // namespace kvs::mm
