// AVX-512 kernels for float weights (F32, F16, BF16) with f32 activations.
// Same compilation scheme as matmul_avx512.cpp (target pragma after includes).
//
// Order (matmul_internal.h): one zmm accumulator per (weight row, activation
// row) pair, lane j summing k = j (mod 16) with fma in increasing k, then the
// fixed tree. The GEMM tile runs exactly the per-pair instruction sequence of
// the n = 1 case, so results do not depend on n. F16 converts with vcvtph2ps
// and BF16 with a shift: both exact, so the math stays plain f32.
#include <immintrin.h>

#include <cstdint>

#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

// GCC 12 reports its own _mm512_undefined_*() as uninitialised.
KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace {

template <GgmlType T>
inline __m512 load_w(const uint8_t* row, int64_t k) {
  if (T == GgmlType::F32) return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
  if (T == GgmlType::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Tail of a row: lanes >= m are zero (adding 0*0 leaves an accumulator that
// started at +0 unchanged, so this equals skipping them).
template <GgmlType T>
inline __m512 load_w_tail(const uint8_t* row, int64_t k, __mmask16 m) {
  if (T == GgmlType::F32) return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + k);
  const __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * k);
  if (T == GgmlType::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// float_tree_sum() on a zmm.
inline float tree_sum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

// RW weight rows x RX activation rows over k in [kb, ke). Each pair's 16
// lane partial sums start from zero (kb == 0) or from `state` (a previous
// k-slice); on the last slice they are reduced into y, else saved to state.
// Splitting k this way replays exactly the fma sequence of an unsplit pass.
template <GgmlType T, int RW, int RX>
void tile(const WeightView& w, int64_t r, const float* x, int64_t ldx, int64_t i0, float* y,
          int64_t ldy, int64_t kb, int64_t ke, float* state, int64_t state_ld) {
  const int64_t cols = w.cols;
  const uint8_t* rows[RW];
  for (int a = 0; a < RW; ++a) rows[a] = w.row(r + a);
  const float* xs[RX];
  for (int b = 0; b < RX; ++b) xs[b] = x + (i0 + b) * ldx;
  __m512 acc[RW][RX];
  for (int a = 0; a < RW; ++a)
    for (int b = 0; b < RX; ++b)
      acc[a][b] = kb == 0 ? _mm512_setzero_ps() : _mm512_load_ps(state + (b * state_ld + a) * 16);
  int64_t k = kb;
  for (; k + 16 <= ke; k += 16) {
    __m512 wv[RW];
    for (int a = 0; a < RW; ++a) wv[a] = load_w<T>(rows[a], k);
    for (int b = 0; b < RX; ++b) {
      const __m512 xv = _mm512_loadu_ps(xs[b] + k);
      for (int a = 0; a < RW; ++a) acc[a][b] = _mm512_fmadd_ps(wv[a], xv, acc[a][b]);
    }
  }
  if (k < ke) {  // only in the last slice: cols % 16 != 0
    const __mmask16 m = __mmask16((1u << (ke - k)) - 1);
    __m512 wv[RW];
    for (int a = 0; a < RW; ++a) wv[a] = load_w_tail<T>(rows[a], k, m);
    for (int b = 0; b < RX; ++b) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, xs[b] + k);
      for (int a = 0; a < RW; ++a) acc[a][b] = _mm512_fmadd_ps(wv[a], xv, acc[a][b]);
    }
  }
  if (ke == cols) {
    for (int a = 0; a < RW; ++a)
      for (int b = 0; b < RX; ++b) y[(i0 + b) * ldy + r + a] = tree_sum(acc[a][b]);
  } else {
    for (int a = 0; a < RW; ++a)
      for (int b = 0; b < RX; ++b) _mm512_store_ps(state + (b * state_ld + a) * 16, acc[a][b]);
  }
}

// n = 1 (decode): 8 rows in flight hide the latency of each row's fma chain.
template <GgmlType T>
void matvec(const WeightView& w, int64_t r0, int64_t r1, const float* x, float* y) {
  int64_t r = r0;
  for (; r + 8 <= r1; r += 8) tile<T, 8, 1>(w, r, x, 0, 0, y, 0, 0, w.cols, nullptr, 0);
  for (; r < r1; ++r) tile<T, 1, 1>(w, r, x, 0, 0, y, 0, 0, w.cols, nullptr, 0);
}

template <GgmlType T, int RX>
void rows_slice(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                int64_t i0, float* y, int64_t ldy, int64_t kb, int64_t ke, float* state) {
  // state: [RX x-rows][rows of the block][16 lanes]
  const int64_t sld = r1 - r0;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4)
    tile<T, 4, RX>(w, r, x, ldx, i0, y, ldy, kb, ke, state + (r - r0) * 16, sld);
  for (; r < r1; ++r) tile<T, 1, RX>(w, r, x, ldx, i0, y, ldy, kb, ke, state + (r - r0) * 16, sld);
}

// n > 1: 4 weight rows x 6 activation rows = 24 accumulators. k is cut into
// slices of kKc so the 6 activation rows of a tile stay in L1 while the
// weight rows stream past; pair partial sums wait in scratch between slices.
template <GgmlType T>
void gemm(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t n,
          float* y, int64_t ldy, Scratch scratch) {
  constexpr int64_t kKc = 512;
  float* state = reinterpret_cast<float*>(scratch.buf);  // [n, row block, 16]
  // Row block so that its state (n * rows * 64 B) fits in scratch.
  int64_t rb = int64_t(scratch.bytes) / (n * 64) / 4 * 4;
  if (rb < 4) rb = 4;
  if (rb * n * 64 > int64_t(scratch.bytes)) {  // huge n: no k split
    for (int64_t i = 0; i < n; i += 6) {
      const int64_t m = n - i < 6 ? n - i : 6;
      for (int64_t r = r0; r < r1; ++r)
        switch (m) {
          case 6: tile<T, 1, 6>(w, r, x, ldx, i, y, ldy, 0, w.cols, nullptr, 0); break;
          case 5: tile<T, 1, 5>(w, r, x, ldx, i, y, ldy, 0, w.cols, nullptr, 0); break;
          case 4: tile<T, 1, 4>(w, r, x, ldx, i, y, ldy, 0, w.cols, nullptr, 0); break;
          case 3: tile<T, 1, 3>(w, r, x, ldx, i, y, ldy, 0, w.cols, nullptr, 0); break;
          case 2: tile<T, 1, 2>(w, r, x, ldx, i, y, ldy, 0, w.cols, nullptr, 0); break;
          default: tile<T, 1, 1>(w, r, x, ldx, i, y, ldy, 0, w.cols, nullptr, 0); break;
        }
    }
    return;
  }
  for (int64_t b0 = r0; b0 < r1; b0 += rb) {
    const int64_t b1 = b0 + rb < r1 ? b0 + rb : r1;
    for (int64_t kb = 0; kb < w.cols; kb += kKc) {
      const int64_t ke = w.cols - kb <= kKc ? w.cols : kb + kKc;
      int64_t i = 0;
      for (; i + 6 <= n; i += 6)
        rows_slice<T, 6>(w, b0, b1, x, ldx, i, y, ldy, kb, ke, state + i * (b1 - b0) * 16);
      float* st = state + i * (b1 - b0) * 16;
      switch (n - i) {
        case 5: rows_slice<T, 5>(w, b0, b1, x, ldx, i, y, ldy, kb, ke, st); break;
        case 4: rows_slice<T, 4>(w, b0, b1, x, ldx, i, y, ldy, kb, ke, st); break;
        case 3: rows_slice<T, 3>(w, b0, b1, x, ldx, i, y, ldy, kb, ke, st); break;
        case 2: rows_slice<T, 2>(w, b0, b1, x, ldx, i, y, ldy, kb, ke, st); break;
        case 1: rows_slice<T, 1>(w, b0, b1, x, ldx, i, y, ldy, kb, ke, st); break;
        default: break;
      }
    }
  }
}

template <GgmlType T>
void rows_t(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t n,
            float* y, int64_t ldy, Scratch s) {
  if (n == 1) matvec<T>(w, r0, r1, x, y);
  else gemm<T>(w, r0, r1, x, ldx, n, y, ldy, s);
}

}  // namespace

void float_rows_avx512(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                       int64_t n, float* y, int64_t ldy, Scratch s) {
  if (w.pack == PackLayout::Panel16) return float_rows_avx512_packed(w, r0, r1, x, ldx, n, y, ldy, s);
  // A Panel8 copy exists only when AVX2 was the ISA at load; this path is then
  // reached only through an ISA override, so plain k-chain code will do.
  if (w.pack == PackLayout::Panel8) return float_rows_chain_scalar(w, r0, r1, x, ldx, n, y, ldy);
  switch (w.type) {
    case GgmlType::F32: return rows_t<GgmlType::F32>(w, r0, r1, x, ldx, n, y, ldy, s);
    case GgmlType::F16: return rows_t<GgmlType::F16>(w, r0, r1, x, ldx, n, y, ldy, s);
    default: return rows_t<GgmlType::BF16>(w, r0, r1, x, ldx, n, y, ldy, s);
  }
}

KVS_TARGET_END()

}  // namespace kvs::mm
