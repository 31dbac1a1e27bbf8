// SIMD element-wise ops (ops.h dispatches here by the active ISA). Each runs
// exactly the scalar definition's operations (exp_poly.h), so results do not
// depend on the ISA; tests compare bit for bit on random inputs.
#include <immintrin.h>

#include "kernels/exp_poly.h"
#include "kernels/ops_simd.h"
#include "kernels/target_region.h"

namespace kvs::simd {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

namespace {

inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(poly::kExpLo));
  x = _mm512_min_ps(x, _mm512_set1_ps(poly::kExpHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(poly::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-poly::kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-poly::kLn2Lo), r);
  __m512 y = _mm512_set1_ps(poly::kExpR[0]);
  for (int i = 1; i < 8; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(poly::kExpR[i]));
  return _mm512_scalef_ps(y, n);
}

inline __m512 swiglu512(__m512 v, __m512 u) {
  const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), v));
  return _mm512_mul_ps(_mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

}  // namespace

void swiglu_avx512(float* g, const float* u, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(g + i, swiglu512(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(g + i, m, swiglu512(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

KVS_TARGET_END()

KVS_TARGET_BEGIN("avx2,fma")

namespace {

inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(poly::kExpLo));
  x = _mm256_min_ps(x, _mm256_set1_ps(poly::kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(poly::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-poly::kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-poly::kLn2Lo), r);
  __m256 y = _mm256_set1_ps(poly::kExpR[0]);
  for (int i = 1; i < 8; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(poly::kExpR[i]));
  // 2^n by building the exponent: n is in [-126, 127] after the clamp, so
  // the scale is a normal float and the product is exact-rounded like scalef.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

inline __m256 swiglu256(__m256 v, __m256 u) {
  const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), v));
  return _mm256_mul_ps(_mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

}  // namespace

void swiglu_avx2(float* g, const float* u, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, swiglu256(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  for (; i < n; ++i) g[i] = poly::swiglu_scalar(g[i], u[i]);
}

KVS_TARGET_END()

}  // namespace kvs::simd
