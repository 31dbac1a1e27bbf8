// AVX2 kernels for float weights (F32, F16, BF16) with f32 activations.
// The 16 lane partial sums of matmul_internal.h are kept as two ymm
// accumulators per (weight row, activation row) pair: lanes 0..7 and 8..15,
// so the result is bit-identical to the AVX-512 and scalar paths.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx2,fma,f16c")

namespace {

template <GgmlType T>
inline __m256 load_w(const uint8_t* row, int64_t k) {
  if (T == GgmlType::F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k));
  if (T == GgmlType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// float_tree_sum() of the 16 lanes lo[0..7], hi[0..7].
inline float tree_sum(__m256 lo, __m256 hi) {
  const __m256 a = _mm256_add_ps(lo, hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

template <GgmlType T, int RW, int RX>
void tile(const WeightView& w, int64_t r, const float* x, int64_t ldx, int64_t i0, float* y,
          int64_t ldy) {
  constexpr int kEs = T == GgmlType::F32 ? 4 : 2;  // weight element size
  const int64_t cols = w.cols;
  const uint8_t* rows[RW];
  for (int a = 0; a < RW; ++a) rows[a] = w.row(r + a);
  const float* xs[RX];
  for (int b = 0; b < RX; ++b) xs[b] = x + (i0 + b) * ldx;
  __m256 acc[RW][RX][2];
  for (int a = 0; a < RW; ++a)
    for (int b = 0; b < RX; ++b) acc[a][b][0] = acc[a][b][1] = _mm256_setzero_ps();
  const int64_t kfull = cols / 16 * 16;
  for (int64_t k = 0; k < kfull; k += 16) {
    for (int h = 0; h < 2; ++h) {
      __m256 wv[RW];
      for (int a = 0; a < RW; ++a) wv[a] = load_w<T>(rows[a], k + 8 * h);
      for (int b = 0; b < RX; ++b) {
        __m256 xv = _mm256_loadu_ps(xs[b] + k + 8 * h);
        // One load per activation vector: left to itself the compiler folds
        // the load into every fma that uses it, RW loads instead of one,
        // and the load ports, not the fma units, set the pace.
        if constexpr (RW > 1) __asm__("" : "+x"(xv));
        for (int a = 0; a < RW; ++a) acc[a][b][h] = _mm256_fmadd_ps(wv[a], xv, acc[a][b][h]);
      }
    }
  }
  if (kfull < cols) {
    // Zero-padded copies of the tail: 0 * 0 added to an accumulator that
    // started at +0 leaves it unchanged, so this equals skipping the lanes.
    const int64_t t = cols - kfull;
    alignas(32) uint8_t wt[RW][64];
    alignas(32) float xt[RX][16];
    for (int a = 0; a < RW; ++a) {
      std::memset(wt[a], 0, sizeof(wt[a]));
      std::memcpy(wt[a], rows[a] + kfull * kEs, size_t(t) * kEs);
    }
    for (int b = 0; b < RX; ++b) {
      std::memset(xt[b], 0, sizeof(xt[b]));
      std::memcpy(xt[b], xs[b] + kfull, size_t(t) * 4);
    }
    for (int h = 0; h < 2; ++h) {
      __m256 wv[RW];
      for (int a = 0; a < RW; ++a) wv[a] = load_w<T>(wt[a], 8 * h);
      for (int b = 0; b < RX; ++b) {
        const __m256 xv = _mm256_load_ps(xt[b] + 8 * h);
        for (int a = 0; a < RW; ++a) acc[a][b][h] = _mm256_fmadd_ps(wv[a], xv, acc[a][b][h]);
      }
    }
  }
  for (int a = 0; a < RW; ++a)
    for (int b = 0; b < RX; ++b) y[(i0 + b) * ldy + r + a] = tree_sum(acc[a][b][0], acc[a][b][1]);
}

// Activation rows [i, i + RX) against weight rows [r0, r1), three at a time.
template <GgmlType T, int RX>
void x_group(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t i,
             float* y, int64_t ldy) {
  int64_t r = r0;
  for (; r + 3 <= r1; r += 3) tile<T, 3, RX>(w, r, x, ldx, i, y, ldy);  // 3 x RX pairs x 2 halves
  if (r1 - r == 2) tile<T, 2, RX>(w, r, x, ldx, i, y, ldy);
  else if (r1 - r == 1) tile<T, 1, RX>(w, r, x, ldx, i, y, ldy);
}

// Bytes of one weight row block: it stays in L2 while every pair of
// activation rows (in L1) passes over it. Streaming all activation rows past
// a few weight rows instead read them from L3 once n * cols * 4 bytes
// outgrew L2. Tiles of 3 weight x 2 activation rows beat 2 x 3 (measured,
// docs/PERFORMANCE.md): the activations, not the half-to-float conversions,
// are what the L1 must hold. Each output is still one tile's whole sum, so
// the order of tiles changes no bit.
constexpr int64_t kRowBlockBytes = 192 * 1024;

template <GgmlType T>
void rows_t(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t n,
            float* y, int64_t ldy) {
  if (n == 1) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) tile<T, 4, 1>(w, r, x, ldx, 0, y, ldy);
    for (; r < r1; ++r) tile<T, 1, 1>(w, r, x, ldx, 0, y, ldy);
    return;
  }
  constexpr int64_t kEs = T == GgmlType::F32 ? 4 : 2;
  const int64_t block = std::max<int64_t>(3, kRowBlockBytes / (std::max<int64_t>(1, w.cols) * kEs) / 3 * 3);
  for (int64_t rb = r0; rb < r1; rb += block) {
    const int64_t re = std::min(r1, rb + block);
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) x_group<T, 2>(w, rb, re, x, ldx, i, y, ldy);
    if (i < n) x_group<T, 1>(w, rb, re, x, ldx, i, y, ldy);
  }
}

}  // namespace

void float_rows_avx2(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                     int64_t n, float* y, int64_t ldy, Scratch s) {
  if (w.pack == PackLayout::Panel8) return float_rows_avx2_packed(w, r0, r1, x, ldx, n, y, ldy, s);
  // A Panel16 copy exists only when AVX-512 was active at load; this path is
  // then reached only through an ISA override, so plain k-chain code will do.
  if (w.pack == PackLayout::Panel16) return float_rows_chain_scalar(w, r0, r1, x, ldx, n, y, ldy);
  switch (w.type) {
    case GgmlType::F32: return rows_t<GgmlType::F32>(w, r0, r1, x, ldx, n, y, ldy);
    case GgmlType::F16: return rows_t<GgmlType::F16>(w, r0, r1, x, ldx, n, y, ldy);
    default: return rows_t<GgmlType::BF16>(w, r0, r1, x, ldx, n, y, ldy);
  }
}

KVS_TARGET_END()

}  // namespace kvs::mm
