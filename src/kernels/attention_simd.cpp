#include "kernels/attention_simd.h"

#include <immintrin.h>

#include "kernels/cpu.h"
#include "kernels/target_region.h"

namespace kvs::attn {

namespace {

float dot_scalar(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
void axpy_scalar(float a, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

KVS_TARGET_BEGIN("avx2,fma")
namespace {
float dot_avx2(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  float s = _mm_cvtss_f32(s4);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
void axpy_avx2(float a, const float* x, float* y, int n) {
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}
}  // namespace
KVS_TARGET_END()

KVS_TARGET_BEGIN("avx512f,avx2,fma")
namespace {
float dot_avx512(const float* a, const float* b, int n) {
  __m512 acc = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {  // masked tail: head_dim 8 (stories260K) and other small widths
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
void axpy_avx512(float a, const float* x, float* y, int n) {
  const __m512 va = _mm512_set1_ps(a);
  int i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}
}  // namespace
KVS_TARGET_END()

const VecOps& vec_ops_scalar() {
  static const VecOps v{dot_scalar, axpy_scalar};
  return v;
}
const VecOps& vec_ops_avx2() {
  static const VecOps v{dot_avx2, axpy_avx2};
  return v;
}
const VecOps& vec_ops_avx512() {
  static const VecOps v{dot_avx512, axpy_avx512};
  return v;
}

const VecOps& vec_ops() {
  switch (active_isa()) {
    case Isa::Avx512: return vec_ops_avx512();
    case Isa::Avx2: return vec_ops_avx2();
    default: return vec_ops_scalar();
  }
}

}  // namespace kvs::attn
