// AVX2 (+FMA, F16C) quantized-weight kernels: the structure of
// matmul_avx512.cpp on 8-row panels, with vpmaddubsw + vpmaddwd in place of
// vpdpbusd. Compiled with a `#pragma GCC target` after all includes (see
// matmul_avx512.cpp for why); reached only through avx2_kernels().
//
// Integer exactness: maddubs adds two u8*s8 products into an int16 with
// saturation. Levels are <= 63 (Q6_K) so a pair is <= 2*63*127 = 16002 and two
// pairs still fit (32004), which lets us add two maddubs results before the
// widening madd. Q8_0 levels are full int8: the kernel feeds |w| (<= 128) and
// sign(x, w), one pair <= 2*128*127 = 32512, widened immediately.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/matmul_avx2_block.h"
#include "kernels/matmul_avx2_unpack.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx2,fma,f16c,bmi,bmi2,popcnt")

namespace {

using namespace avx2_detail;

// ---------------------------------------------------------------- activations

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline float hmax_ps(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

void quantize_x_avx2(const float* x, int64_t cols, QFormat f, XBlock* out) {
  const int64_t nb = cols / kQBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  float group = 0.0f;  // K-quants: the super-block's maximum
  for (int64_t b = 0; b < nb; ++b) {
    __m256 v[4];
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
      a = _mm256_max_ps(a, _mm256_andnot_ps(sign, v[i]));
    }
    if (f.super && b % kSuperBlocks == 0) {
      __m256 g = _mm256_setzero_ps();
      for (int64_t e = 32 * b; e < 32 * std::min(nb, b + kSuperBlocks); e += 8) g = _mm256_max_ps(g, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + e)));
      group = hmax_ps(g);
    }
    const float amax = f.super ? group : hmax_ps(a);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));  // nearest-even, like round_rne()
      q[i] = _mm256_min_epi32(_mm256_max_epi32(q[i], lo), hi);
    }
    // packs interleave the 128-bit lanes; the permute restores element order.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    XBlock& o = out[b];
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q), _mm256_permutevar8x32_epi32(p, order));
    const int32_t s0 = hsum_epi32(_mm256_add_epi32(q[0], q[1]));
    const int32_t s1 = hsum_epi32(_mm256_add_epi32(q[2], q[3]));
    o.d = d;
    o.s = d * float(s0 + s1);
    if (f.sub16) {
      o.corr[0] = -f.off * s0;
      o.corr[1] = -f.off * s1;
    } else {
      o.corr[0] = -f.off * (s0 + s1);
      o.corr[1] = f.super ? s0 + s1 : 0;
    }
  }
}

// ------------------------------------------------------------ drivers

template <class U>
void matvec_fused(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, float* y) {
  const int64_t units = w.cols / kQBlock / U::kBlocks;
  Panel p;
  for (int64_t p0 = r0; p0 < r1; p0 += L) {
    make_panel(w, p0, r1, &p);
    __m256 acc = _mm256_setzero_ps();
    KSum S;  // K-quants: the super-block's integer sums (kblock)
    for (int64_t u = 0; u < units; ++u) {
      const XBlock* xb = xq + u * U::kBlocks;
      U::unit(p, u, [&](int j, const __m256i* W, __m256 ws0, __m256 ws1, __m256 wm) {
        acc = kblock<U::kSuper, U::kMin, U::kSigned, kLevelBits<U>>(W, ws0, ws1, wm, xb[j], j, S, acc);
      });
    }
    _mm256_maskstore_ps(y + p0, lane_mask(p.nvalid), acc);
  }
}

template <class U>
void gemm_panels(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n, float* y,
                 int64_t ldy, Scratch scratch) {
  const int64_t nb = w.cols / kQBlock;
  uint8_t* slice = scratch.buf;  // [KB blocks][352 B], 64-B aligned
  Panel p;
  for (int64_t p0 = r0; p0 < r1; p0 += L) {
    make_panel(w, p0, r1, &p);
    const __m256i mask = lane_mask(p.nvalid);
    for (int64_t kb0 = 0; kb0 < nb; kb0 += KB) {
      const int64_t kb = nb - kb0 < KB ? nb - kb0 : KB;
      for (int64_t bb = 0; bb < kb; bb += U::kBlocks)
        unpack_to_scratch<U>(p, (kb0 + bb) / U::kBlocks, slice + bb * kPanelBlockBytes);
      int64_t i0 = 0;
      for (; i0 + R <= n; i0 += R) tile_from_scratch<R, U>(slice, kb0, kb, xq, nb, i0, y, ldy, p0, mask);
      for (; i0 < n; ++i0) tile_from_scratch<1, U>(slice, kb0, kb, xq, nb, i0, y, ldy, p0, mask);
    }
  }
}

template <class U>
void run_fast(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n, float* y,
              int64_t ldy, Scratch s) {
  if (n == 1) matvec_fused<U>(w, r0, r1, xq, y);
  else gemm_panels<U>(w, r0, r1, xq, n, y, ldy, s);
}

void quant_rows_avx2(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
                     float* y, int64_t ldy, Scratch s) {
  if (w.pack == PackLayout::Panel8) return quant_rows_avx2_packed(w, r0, r1, xq, n, y, ldy, s);
  switch (w.type) {  // the driver only sends is_quant_type() formats
    case GgmlType::Q4_0: return run_fast<UnpackQ4_0>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q8_0: return run_fast<UnpackQ8_0>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q4_1: return run_fast<UnpackQ4_1>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q5_0: return run_fast<UnpackQ5<false>>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q5_1: return run_fast<UnpackQ5<true>>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q4_K: return run_fast<UnpackQK<false>>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q5_K: return run_fast<UnpackQK<true>>(w, r0, r1, xq, n, y, ldy, s);
    case GgmlType::MXFP4: return run_fast<UnpackMXFP4>(w, r0, r1, xq, n, y, ldy, s);
    default: return run_fast<UnpackQ6K>(w, r0, r1, xq, n, y, ldy, s);
  }
}

}  // namespace

const IsaKernels& avx2_kernels() {
  static const IsaKernels k{L, quantize_x_avx2, true, quant_rows_avx2, float_rows_avx2};
  return k;
}

KVS_TARGET_END()

}  // namespace kvs::mm
