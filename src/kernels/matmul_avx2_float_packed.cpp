// AVX2 kernels for float weights (F32, F16, BF16) in the Panel8 float layout
// (weight_pack.h): for each panel of 8 rows, element k of the 8 rows is one
// vector, so a ymm holds 8 output rows and the product is an outer product:
// broadcast x[k], fma into 8 rows at once.
//
// Order (matmul_internal.h, "k-chain"): each output is one fma chain over k
// in increasing order from +0, the same order as the AVX-512 Panel16 path,
// so an AVX2 and an AVX-512 machine give the same bits. The chain is per
// lane, so n, the tile shape and the k slicing (partials parked in y, exact
// f32) never change a bit.
//
// Why this form: the file layout's 16-lane order needs two ymm accumulators
// per output, so its tile holds few outputs and moves many bytes per fma.
// Here one ymm holds 8 outputs: a 2-panel x 6-row tile fills 12 registers
// with 8 outputs each and moves far fewer bytes per fma, so the fma units,
// not L1/L2, set the pace (figures in docs/PERFORMANCE.md).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/decode_variant.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx2,fma,f16c")

namespace {

constexpr int64_t kL = 8;     // rows per panel = lanes per ymm
constexpr int64_t kKc = 512;  // k slice: a tile's activation rows stay in L1 across the block
constexpr int64_t kMb = 96;   // rows per block (12 panels): its slice stays in L2
constexpr int kNr = 6;        // activation rows per tile: 2 x 6 accumulators
// Up to this many activation rows, passes of up to kNr rows read the panels
// straight through: cheaper than gemm's slices with partials parked in y
// (docs/PERFORMANCE.md).
constexpr int64_t kDirectMaxN = 12;

template <GgmlType T>
constexpr int64_t elem_bytes() {
  return T == GgmlType::F32 ? 4 : 2;
}

// Element k of the 8 rows of a panel (panel points at its k = 0).
template <GgmlType T>
inline __m256 load8(const uint8_t* panel, int64_t k) {
  const uint8_t* p = panel + k * kL * elem_bytes<T>();
  if (T == GgmlType::F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (T == GgmlType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Valid lanes of the panel whose first row is r (the matrix's last panel
// may be partial; its extra lanes are computed but never stored).
inline int valid_lanes(int64_t r, int64_t rows) { return int(std::min<int64_t>(kL, rows - r)); }

inline __m256i lane_mask(int v) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), idx);
}

inline __m256 load_y(const float* p, int v) {
  return v == kL ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(v));
}

inline void store_y(float* p, int v, __m256 a) {
  if (v == kL) _mm256_storeu_ps(p, a);
  else _mm256_maskstore_ps(p, lane_mask(v), a);
}

// MR panels x NR activation rows over kn steps of k. pan[a] points at the
// current k of panel a; y points at row 0 of panel 0 (panel a at y + 8a).
// first: the chains start from +0, else from the partials in y.
template <GgmlType T, int MR, int NR, int kPrefetch>
void tile(const uint8_t* const* pan, int64_t kn, const float* x, int64_t ldx, float* y,
          int64_t ldy, bool first, const int* valid) {
  __m256 acc[MR][NR];
  for (int a = 0; a < MR; ++a)
    for (int b = 0; b < NR; ++b)
      acc[a][b] = first ? _mm256_setzero_ps() : load_y(y + b * ldy + a * kL, valid[a]);
  const float* xb[NR];
  for (int b = 0; b < NR; ++b) xb[b] = x + b * ldx;
  for (int64_t k = 0; k < kn; ++k) {
    __m256 wv[MR];
    for (int a = 0; a < MR; ++a) {
      if (kPrefetch > 0)
        _mm_prefetch(reinterpret_cast<const char*>(pan[a] + k * kL * elem_bytes<T>() + kPrefetch), _MM_HINT_T0);
      wv[a] = load8<T>(pan[a], k);
    }
    for (int b = 0; b < NR; ++b) {
      const __m256 xv = _mm256_broadcast_ss(xb[b] + k);
      for (int a = 0; a < MR; ++a) acc[a][b] = _mm256_fmadd_ps(wv[a], xv, acc[a][b]);
    }
  }
  for (int a = 0; a < MR; ++a)
    for (int b = 0; b < NR; ++b) store_y(y + b * ldy + a * kL, valid[a], acc[a][b]);
}

// Tile with a run-time NR in [1, kNr].
template <GgmlType T, int MR>
void tile_n(int nr, const uint8_t* const* pan, int64_t kn, const float* x, int64_t ldx, float* y,
            int64_t ldy, bool first, const int* valid) {
  switch (nr) {
#define KVS_NR(N) case N: return tile<T, MR, N, 0>(pan, kn, x, ldx, y, ldy, first, valid);
    KVS_NR(1) KVS_NR(2) KVS_NR(3) KVS_NR(4) KVS_NR(5) KVS_NR(6)
#undef KVS_NR
    default: return;
  }
}

// Small n (decode, small batches): read the panels straight through, MR panels per pass so
// MR * NR chains hide the fma latency; prefetch kAhead bytes ahead of each
// stream (0: none).
template <GgmlType T, int MR, int NR, int kAhead>
void direct(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, float* y,
            int64_t ldy) {
  const int64_t pb = w.cols * kL * elem_bytes<T>();
  int64_t r = r0;
  for (; r + MR * kL <= r1; r += MR * kL) {
    const uint8_t* pan[MR];
    int v[MR];
    for (int a = 0; a < MR; ++a) {
      pan[a] = w.packed + (r / kL + a) * pb;
      v[a] = valid_lanes(r + a * kL, w.rows);
    }
    tile<T, MR, NR, kAhead>(pan, w.cols, x, ldx, y + r, ldy, true, v);
  }
  for (; r < r1; r += kL) {
    const uint8_t* pan[1] = {w.packed + (r / kL) * pb};
    const int v[1] = {valid_lanes(r, w.rows)};
    tile<T, 1, NR, kAhead>(pan, w.cols, x, ldx, y + r, ldy, true, v);
  }
}

// Decode (n = 1) in the machine's variant (kernels/decode_variant.h):
// `panels` 4 / 2 / 1 streams 8 / 4 / 2 float panels per pass (one fma chain
// each, so the default keeps eight chains in flight against the fma
// latency), `prefetch` the distance ahead. The chain per output is the same
// in every variant, so the bits are.
template <GgmlType T, int MR>
void decode_mr(const WeightView& w, int64_t r0, int64_t r1, const float* x, float* y, int prefetch) {
  switch (prefetch) {
    case 0: return direct<T, MR, 1, 0>(w, r0, r1, x, 0, y, 0);
    case 512: return direct<T, MR, 1, 512>(w, r0, r1, x, 0, y, 0);
    case 2048: return direct<T, MR, 1, 2048>(w, r0, r1, x, 0, y, 0);
    default: return direct<T, MR, 1, 1024>(w, r0, r1, x, 0, y, 0);
  }
}

template <GgmlType T>
void decode(const WeightView& w, int64_t r0, int64_t r1, const float* x, float* y) {
  const DecodeVariant v = decode_variant(w.type);
  if (v.panels >= 4) return decode_mr<T, 8>(w, r0, r1, x, y, v.prefetch);
  if (v.panels == 2) return decode_mr<T, 4>(w, r0, r1, x, y, v.prefetch);
  return decode_mr<T, 2>(w, r0, r1, x, y, v.prefetch);
}

// n > kDirectMaxN: blocks of kMb rows; per k slice every group of kNr
// activation rows (its slice in L1) passes over the block's panels (their
// slice in L2), two panels per tile.
template <GgmlType T>
void gemm(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t n,
          float* y, int64_t ldy) {
  const int64_t pb = w.cols * kL * elem_bytes<T>();
  for (int64_t rb = r0; rb < r1; rb += kMb) {
    const int64_t np = (std::min(r1, rb + kMb) - rb + kL - 1) / kL;  // panels in this block
    int valid[kMb / kL];
    for (int64_t p = 0; p < np; ++p) valid[p] = valid_lanes(rb + p * kL, w.rows);
    for (int64_t kb = 0; kb < w.cols; kb += kKc) {
      const int64_t kn = std::min(kKc, w.cols - kb);
      for (int64_t i = 0; i < n; i += kNr) {
        const int nr = int(std::min<int64_t>(kNr, n - i));
        const float* xi = x + i * ldx + kb;
        float* yi = y + i * ldy;
        for (int64_t p = 0; p < np; p += 2) {
          const uint8_t* base = w.packed + (rb / kL + p) * pb + kb * kL * elem_bytes<T>();
          const uint8_t* pan[2] = {base, base + pb};
          float* yp = yi + rb + p * kL;
          if (p + 1 < np) tile_n<T, 2>(nr, pan, kn, xi, ldx, yp, ldy, kb == 0, valid + p);
          else tile_n<T, 1>(nr, pan, kn, xi, ldx, yp, ldy, kb == 0, valid + p);
        }
      }
    }
  }
}

template <GgmlType T>
void direct_n(int nr, const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, float* y,
              int64_t ldy) {
  switch (nr) {
    case 2: return direct<T, 4, 2, 512>(w, r0, r1, x, ldx, y, ldy);
    case 3: return direct<T, 4, 3, 512>(w, r0, r1, x, ldx, y, ldy);
    case 4: return direct<T, 2, 4, 512>(w, r0, r1, x, ldx, y, ldy);
    case 5: return direct<T, 2, 5, 512>(w, r0, r1, x, ldx, y, ldy);
    case 6: return direct<T, 2, 6, 512>(w, r0, r1, x, ldx, y, ldy);
    default: return;
  }
}

template <GgmlType T>
void rows_t(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t n,
            float* y, int64_t ldy) {
  if (n == 1) return decode<T>(w, r0, r1, x, y);
  if (n > kDirectMaxN) return gemm<T>(w, r0, r1, x, ldx, n, y, ldy);
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

void float_rows_avx2_packed(const WeightView& w, int64_t r0, int64_t r1, const float* x,
                            int64_t ldx, int64_t n, float* y, int64_t ldy, Scratch) {
  switch (w.type) {
    case GgmlType::F32: return rows_t<GgmlType::F32>(w, r0, r1, x, ldx, n, y, ldy);
    case GgmlType::F16: return rows_t<GgmlType::F16>(w, r0, r1, x, ldx, n, y, ldy);
    default: return rows_t<GgmlType::BF16>(w, r0, r1, x, ldx, n, y, ldy);
  }
}

KVS_TARGET_END()

}  // namespace kvs::mm
