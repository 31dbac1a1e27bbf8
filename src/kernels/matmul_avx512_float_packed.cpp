// AVX-512 kernels for float weights (F32, F16, BF16) in the Panel16 float
// layout (weight_pack.h): for each panel of 16 rows, element k of the 16
// rows is one vector, so a zmm holds 16 output rows and the product is an
// outer product: broadcast x[k], fma into 16 rows at once.
//
// Order (matmul_internal.h, "k-chain"): each output is one fma chain over k
// in increasing order from +0. A tile keeps 16 outputs per accumulator and
// the chain is per lane, so n, the tile shape and the k slicing (partials
// parked in y, exact f32) never change a bit.
//
// Why this form: the 16-lane dot-product tile of the file layout peaked at
// 80-87 GFLOP/s per core here; the outer-product tile over an f32 scratch
// slice reaches ~150 (fma-bound) in the same harness.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace {

constexpr int64_t kL = 16;    // rows per panel = lanes per zmm
constexpr int64_t kKc = 256;  // k slice converted to f32 scratch per block
constexpr int64_t kMb = 128;  // rows per block (8 panels): the slice is 128 KB, L2-resident
constexpr int kNr = 12;       // activation rows per tile: 2 x 12 accumulators
// Below this many activation rows, passes of up to kNr rows read the
// panels in place (converting in registers): at these n the weights stream
// from DRAM and the f32 scratch copy cost more than the passes' re-reads
// (docs/PERFORMANCE.md).
constexpr int64_t kScratchMinN = 49;

template <GgmlType T>
constexpr int64_t elem_bytes() {
  return T == GgmlType::F32 ? 4 : 2;
}

// Element k of the 16 rows of a panel (panel points at its k = 0).
template <GgmlType T>
inline __m512 load16(const uint8_t* panel, int64_t k) {
  const uint8_t* p = panel + k * kL * elem_bytes<T>();
  if (T == GgmlType::F32) return _mm512_loadu_ps(p);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (T == GgmlType::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Valid lanes of the panel whose first row is r (the matrix's last panel
// may be partial; its extra lanes are computed but never stored).
inline __mmask16 lane_mask(int64_t r, int64_t rows) {
  const int64_t v = rows - r;
  return v >= kL ? __mmask16(0xFFFF) : __mmask16((1u << v) - 1);
}

// MR panels x NR activation rows over kn steps of k. pan[a] points at the
// current k of panel a; y points at row 0 of panel 0 (panel a at y + 16a).
// first: the chains start from +0, else from the partials in y.
template <GgmlType T, int MR, int NR, bool kPrefetch>
void tile(const uint8_t* const* pan, int64_t kn, const float* x, int64_t ldx, float* y,
          int64_t ldy, bool first, const __mmask16* mask) {
  __m512 acc[MR][NR];
  for (int a = 0; a < MR; ++a)
    for (int b = 0; b < NR; ++b)
      acc[a][b] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[a], y + b * ldy + a * kL);
  for (int64_t k = 0; k < kn; ++k) {
    __m512 wv[MR];
    for (int a = 0; a < MR; ++a) {
      if (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(pan[a] + (k + 32) * kL * elem_bytes<T>()), _MM_HINT_T0);
      wv[a] = load16<T>(pan[a], k);
    }
    for (int b = 0; b < NR; ++b) {
      const __m512 xv = _mm512_set1_ps(x[b * ldx + k]);
      for (int a = 0; a < MR; ++a) acc[a][b] = _mm512_fmadd_ps(wv[a], xv, acc[a][b]);
    }
  }
  for (int a = 0; a < MR; ++a)
    for (int b = 0; b < NR; ++b) _mm512_mask_storeu_ps(y + b * ldy + a * kL, mask[a], acc[a][b]);
}

// Tile with a run-time NR in [1, kNr].
template <GgmlType T, int MR>
void tile_n(int nr, const uint8_t* const* pan, int64_t kn, const float* x, int64_t ldx, float* y,
            int64_t ldy, bool first, const __mmask16* mask) {
  switch (nr) {
#define KVS_NR(N) case N: return tile<T, MR, N, false>(pan, kn, x, ldx, y, ldy, first, mask);
    KVS_NR(1) KVS_NR(2) KVS_NR(3) KVS_NR(4) KVS_NR(5) KVS_NR(6)
    KVS_NR(7) KVS_NR(8) KVS_NR(9) KVS_NR(10) KVS_NR(11) KVS_NR(12)
#undef KVS_NR
    default: return;
  }
}

// Small n (decode, small batches): read the packed panels directly, MR
// panels at a time so MR * NR chains hide the fma latency; prefetch ahead
// of the stream.
template <GgmlType T, int NR>
void direct(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, float* y,
            int64_t ldy) {
  // Panels per pass: MR * NR accumulators, MR weight vectors and the
  // broadcast x fit the 32 zmm registers.
  constexpr int MR = NR <= 6 ? 4 : 2;
  const int64_t pb = w.cols * kL * elem_bytes<T>();
  int64_t r = r0;
  for (; r + MR * kL <= r1; r += MR * kL) {
    const uint8_t* pan[MR];
    __mmask16 m[MR];
    for (int a = 0; a < MR; ++a) {
      pan[a] = w.packed + (r / kL + a) * pb;
      m[a] = lane_mask(r + a * kL, w.rows);
    }
    tile<T, MR, NR, true>(pan, w.cols, x, ldx, y + r, ldy, true, m);
  }
  for (; r < r1; r += kL) {
    const uint8_t* pan[1] = {w.packed + (r / kL) * pb};
    const __mmask16 m[1] = {lane_mask(r, w.rows)};
    tile<T, 1, NR, true>(pan, w.cols, x, ldx, y + r, ldy, true, m);
  }
}

// n >= kScratchMinN: blocks of kMb rows; per k slice the block's panels are converted
// once to f32 scratch [panel][kKc][16] and reused by every group of kNr
// activation rows (whose slice stays in L1 across the block's panels).
template <GgmlType T>
void gemm(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t n,
          float* y, int64_t ldy, Scratch s) {
  static_assert(kMb / kL * kKc * kL * 4 <= int64_t(kScratchBytes));
  float* wf = reinterpret_cast<float*>(s.buf);  // [kMb / 16][kKc][16]
  const int64_t pb = w.cols * kL * elem_bytes<T>();
  for (int64_t rb = r0; rb < r1; rb += kMb) {
    const int64_t np = (std::min(r1, rb + kMb) - rb + kL - 1) / kL;  // panels in this block
    __mmask16 mask[kMb / kL];
    for (int64_t p = 0; p < np; ++p) mask[p] = lane_mask(rb + p * kL, w.rows);
    for (int64_t kb = 0; kb < w.cols; kb += kKc) {
      const int64_t kn = std::min(kKc, w.cols - kb);
      for (int64_t p = 0; p < np; ++p) {
        const uint8_t* src = w.packed + (rb / kL + p) * pb + kb * kL * elem_bytes<T>();
        float* dst = wf + p * kKc * kL;
        for (int64_t k = 0; k < kn; ++k) _mm512_store_ps(dst + k * kL, load16<T>(src, k));
      }
      for (int64_t i = 0; i < n; i += kNr) {
        const int nr = int(std::min<int64_t>(kNr, n - i));
        const float* xi = x + i * ldx + kb;
        float* yi = y + i * ldy;
        for (int64_t p = 0; p < np; p += 2) {
          const uint8_t* pan[2] = {reinterpret_cast<const uint8_t*>(wf + p * kKc * kL),
                                   reinterpret_cast<const uint8_t*>(wf + (p + 1) * kKc * kL)};
          float* yp = yi + rb + p * kL;
          if (p + 1 < np) tile_n<GgmlType::F32, 2>(nr, pan, kn, xi, ldx, yp, ldy, kb == 0, mask + p);
          else tile_n<GgmlType::F32, 1>(nr, pan, kn, xi, ldx, yp, ldy, kb == 0, mask + p);
        }
      }
    }
  }
}

template <GgmlType T>
void direct_n(int nr, const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, float* y,
              int64_t ldy) {
  switch (nr) {
#define KVS_NR(N) case N: return direct<T, N>(w, r0, r1, x, ldx, y, ldy);
    KVS_NR(1) KVS_NR(2) KVS_NR(3) KVS_NR(4) KVS_NR(5) KVS_NR(6)
    KVS_NR(7) KVS_NR(8) KVS_NR(9) KVS_NR(10) KVS_NR(11) KVS_NR(12)
#undef KVS_NR
    default: return;
  }
}

template <GgmlType T>
void rows_t(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t n,
            float* y, int64_t ldy, Scratch s) {
  if (n >= kScratchMinN) return gemm<T>(w, r0, r1, x, ldx, n, y, ldy, s);
  // Passes of at most kNr rows, as even as they can be, each streaming the
  // weights once.
  const int64_t passes = (n + kNr - 1) / kNr;
  for (int64_t p = 0, i = 0; p < passes; ++p) {
    const int64_t nr = (n - i) / (passes - p);
    direct_n<T>(int(nr), w, r0, r1, x + i * ldx, ldx, y + i * ldy, ldy);
    i += nr;
  }
}

}  // namespace

void float_rows_avx512_packed(const WeightView& w, int64_t r0, int64_t r1, const float* x,
                              int64_t ldx, int64_t n, float* y, int64_t ldy, Scratch s) {
  switch (w.type) {
    case GgmlType::F32: return rows_t<GgmlType::F32>(w, r0, r1, x, ldx, n, y, ldy, s);
    case GgmlType::F16: return rows_t<GgmlType::F16>(w, r0, r1, x, ldx, n, y, ldy, s);
    default: return rows_t<GgmlType::BF16>(w, r0, r1, x, ldx, n, y, ldy, s);
  }
}

KVS_TARGET_END()

}  // namespace kvs::mm
