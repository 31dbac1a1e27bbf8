// SIMD element-wise ops (ops.h dispatches here by the active ISA). Each runs
// exactly the scalar definition's operations (exp_poly.h), so results do not
// depend on the ISA; tests compare bit for bit on random inputs. Compiled
// with -ffp-contract=off (CMakeLists.txt): only the fmas the definitions
// name are fused.
#include <immintrin.h>

#include "kernels/exp_poly.h"
#include "kernels/ops_simd.h"
#include "kernels/target_region.h"

namespace kvs::simd {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

namespace {

#define KVS_EXP_POLY_512
#include "kernels/exp_poly_simd.h"
#undef KVS_EXP_POLY_512

inline __m512 swiglu512(__m512 v, __m512 u) {
  const __m512 e = exp_poly512(_mm512_sub_ps(_mm512_setzero_ps(), v));
  return _mm512_mul_ps(_mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

inline __m512 geglu512(__m512 v, __m512 u) {
  const __m512 inner = _mm512_fmadd_ps(_mm512_set1_ps(poly::kGeluA), _mm512_mul_ps(v, v), _mm512_set1_ps(1.0f));
  const __m512 z = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(poly::kGeluK)), inner);
  return _mm512_mul_ps(_mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_poly512(z))), u);
}

// clamped_swiglu_scalar's operations; -x flips the sign bit as negation does.
inline __m512 clamped_swiglu512(__m512 v, __m512 u, __m512 alpha, __m512 limit) {
  const __m512 x = _mm512_min_ps(limit, v);
  const __m512 y = _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), limit), _mm512_min_ps(limit, u));
  const __m512 e = exp_poly512(_mm512_mul_ps(alpha, _mm512_xor_ps(x, _mm512_set1_ps(-0.0f))));
  return _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)),
                       _mm512_add_ps(y, _mm512_set1_ps(1.0f)));
}

inline __m512 softcap512(__m512 x, const poly::Softcap& s) {
  const __m512 e = exp_poly512(_mm512_mul_ps(x, _mm512_set1_ps(s.k)));
  return _mm512_sub_ps(_mm512_set1_ps(s.c), _mm512_div_ps(_mm512_set1_ps(s.c2), _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
}

// g[i] = f(g[i], u[i]) over 16 lanes, the tail under a mask.
template <__m512 (*F)(__m512, __m512)>
inline void map2_512(float* g, const float* u, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(g + i, F(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(g + i, m, F(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

}  // namespace

void swiglu_avx512(float* g, const float* u, int n) { map2_512<swiglu512>(g, u, n); }
void geglu_avx512(float* g, const float* u, int n) { map2_512<geglu512>(g, u, n); }

void clamped_swiglu_avx512(float* g, const float* u, int n, float alpha, float limit) {
  const __m512 a = _mm512_set1_ps(alpha), l = _mm512_set1_ps(limit);
  int i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(g + i, clamped_swiglu512(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i), a, l));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(g + i, m, clamped_swiglu512(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i), a, l));
  }
}

// Lanes i % 32 of four double vectors, a zero-padded copy for the tail
// (adding +0 leaves a sum of squares as it was).
double sum_squares_avx512(const float* x, int n) {
  __m512d a[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  const auto add32 = [&](const float* p) {
    for (int k = 0; k < 4; ++k) {
      const __m512d d = _mm512_cvtps_pd(_mm256_loadu_ps(p + 8 * k));
      a[k] = _mm512_fmadd_pd(d, d, a[k]);
    }
  };
  int i = 0;
  for (; i + 32 <= n; i += 32) add32(x + i);
  if (i < n) {
    alignas(64) float t[32] = {};
    for (int j = i; j < n; ++j) t[j - i] = x[j];
    add32(t);
  }
  const __m512d s = _mm512_add_pd(_mm512_add_pd(a[0], a[2]), _mm512_add_pd(a[1], a[3]));  // 16, then 8 apart
  const __m256d q = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));  // 4 apart
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(q), _mm256_extractf128_pd(q, 1));      // 2 apart
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

void softcap_avx512(float* x, int n, float cap) {
  const poly::Softcap s(cap);
  int i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, softcap512(_mm512_loadu_ps(x + i), s));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, softcap512(_mm512_maskz_loadu_ps(m, x + i), s));
  }
}

KVS_TARGET_END()

KVS_TARGET_BEGIN("avx2,fma")

namespace {

#define KVS_EXP_POLY_256
#include "kernels/exp_poly_simd.h"
#undef KVS_EXP_POLY_256

inline __m256 swiglu256(__m256 v, __m256 u) {
  const __m256 e = exp_poly256(_mm256_sub_ps(_mm256_setzero_ps(), v));
  return _mm256_mul_ps(_mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

inline __m256 geglu256(__m256 v, __m256 u) {
  const __m256 inner = _mm256_fmadd_ps(_mm256_set1_ps(poly::kGeluA), _mm256_mul_ps(v, v), _mm256_set1_ps(1.0f));
  const __m256 z = _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(poly::kGeluK)), inner);
  return _mm256_mul_ps(_mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_poly256(z))), u);
}

inline __m256 clamped_swiglu256(__m256 v, __m256 u, __m256 alpha, __m256 limit) {
  const __m256 x = _mm256_min_ps(limit, v);
  const __m256 y = _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), limit), _mm256_min_ps(limit, u));
  const __m256 e = exp_poly256(_mm256_mul_ps(alpha, _mm256_xor_ps(x, _mm256_set1_ps(-0.0f))));
  return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                       _mm256_add_ps(y, _mm256_set1_ps(1.0f)));
}

inline __m256 softcap256(__m256 x, const poly::Softcap& s) {
  const __m256 e = exp_poly256(_mm256_mul_ps(x, _mm256_set1_ps(s.k)));
  return _mm256_sub_ps(_mm256_set1_ps(s.c), _mm256_div_ps(_mm256_set1_ps(s.c2), _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
}

}  // namespace

void swiglu_avx2(float* g, const float* u, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, swiglu256(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  for (; i < n; ++i) g[i] = poly::swiglu_scalar(g[i], u[i]);
}

void geglu_avx2(float* g, const float* u, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, geglu256(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  for (; i < n; ++i) g[i] = poly::geglu_scalar(g[i], u[i]);
}

void clamped_swiglu_avx2(float* g, const float* u, int n, float alpha, float limit) {
  const __m256 a = _mm256_set1_ps(alpha), l = _mm256_set1_ps(limit);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(g + i, clamped_swiglu256(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i), a, l));
  for (; i < n; ++i) g[i] = poly::clamped_swiglu_scalar(g[i], u[i], alpha, limit);
}

// Lanes i % 32 of eight double vectors (ops.cpp's order).
double sum_squares_avx2(const float* x, int n) {
  __m256d a[8];
  for (auto& v : a) v = _mm256_setzero_pd();
  const auto add32 = [&](const float* p) {
    for (int k = 0; k < 8; ++k) {
      const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(p + 4 * k));
      a[k] = _mm256_fmadd_pd(d, d, a[k]);
    }
  };
  int i = 0;
  for (; i + 32 <= n; i += 32) add32(x + i);
  if (i < n) {
    alignas(32) float t[32] = {};
    for (int j = i; j < n; ++j) t[j - i] = x[j];
    add32(t);
  }
  __m256d r[4];
  for (int k = 0; k < 4; ++k) r[k] = _mm256_add_pd(a[k], a[k + 4]);                    // 16 apart
  const __m256d q = _mm256_add_pd(_mm256_add_pd(r[0], r[2]), _mm256_add_pd(r[1], r[3]));  // 8, then 4 apart
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(q), _mm256_extractf128_pd(q, 1));   // 2 apart
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

void softcap_avx2(float* x, int n, float cap) {
  const poly::Softcap s(cap);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, softcap256(_mm256_loadu_ps(x + i), s));
  for (; i < n; ++i) x[i] = poly::softcap_scalar(x[i], s);
}

KVS_TARGET_END()

}  // namespace kvs::simd
