#include "kernels/ops.h"

#include <cmath>

#include "kernels/cpu.h"
#include "kernels/exp_poly.h"
#include "kernels/ops_simd.h"

namespace kvs {

// The sum of squares in one order on every ISA: element i into lane i % 32
// of 32 double accumulators (each square is exact in double), then the
// lanes pairwise 16 apart, 8, 4, 2, 1. One running sum waited on the add
// latency at every element (docs/PERFORMANCE.md).
double sum_squares_scalar(const float* x, int n) {
  double a[32] = {};
  for (int i = 0; i < n; ++i) a[i % 32] += double(x[i]) * x[i];
  for (int w = 16; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}

double sum_squares(const float* x, int n) {
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512: return simd::sum_squares_avx512(x, n);
    case Isa::Avx2: return simd::sum_squares_avx2(x, n);
    default: return sum_squares_scalar(x, n);
  }
}

void rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
  // Sum in double: the scale then hardly depends on the summation order.
  const double ss = sum_squares(x, n);
  const float scale = float(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void add_inplace(float* x, const float* y, int n) {
  for (int i = 0; i < n; ++i) x[i] += y[i];
}

void swiglu_inplace(float* g, const float* u, int n) {
  // libm's expf was ~6% of a 1.1B pp128 profile; the polynomial exp runs
  // 16 lanes at a time and gives the same bits on every ISA.
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512: return simd::swiglu_avx512(g, u, n);
    case Isa::Avx2: return simd::swiglu_avx2(g, u, n);
    default:
      for (int i = 0; i < n; ++i) g[i] = poly::swiglu_scalar(g[i], u[i]);
  }
}

void clamped_swiglu_inplace(float* g, const float* u, int n, float alpha, float limit) {
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512: return simd::clamped_swiglu_avx512(g, u, n, alpha, limit);
    case Isa::Avx2: return simd::clamped_swiglu_avx2(g, u, n, alpha, limit);
    default:
      for (int i = 0; i < n; ++i) g[i] = poly::clamped_swiglu_scalar(g[i], u[i], alpha, limit);
  }
}

void geglu_inplace(float* g, const float* u, int n) {
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512: return simd::geglu_avx512(g, u, n);
    case Isa::Avx2: return simd::geglu_avx2(g, u, n);
    default:
      for (int i = 0; i < n; ++i) g[i] = poly::geglu_scalar(g[i], u[i]);
  }
}

void softcap_inplace(float* x, int n, float cap) {
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512: return simd::softcap_avx512(x, n, cap);
    case Isa::Avx2: return simd::softcap_avx2(x, n, cap);
    default: {
      const poly::Softcap s(cap);
      for (int i = 0; i < n; ++i) x[i] = poly::softcap_scalar(x[i], s);
    }
  }
}

void softmax_inplace(float* x, int n) {
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  float sum = 0.f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void RopeTable::compute(int pos, int n_rot, float theta, float* cos_out, float* sin_out) const {
  for (int i = 0; i < n_rot / 2; ++i) {
    const float freq = 1.0f / std::pow(theta, float(2 * i) / float(n_rot));
    const float a = float(pos) * freq;
    cos_out[i] = std::cos(a);
    sin_out[i] = std::sin(a);
  }
}

void rope_apply(float* x, int n_heads, int head_dim, int n_rot, bool neox, const float* c,
                const float* s) {
  const int half = n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;  // [head_dim]
    if (neox) {
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = a * s[i] + b * c[i];
      }
    } else {
      for (int i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c[i] - b * s[i];
        v[2 * i + 1] = a * s[i] + b * c[i];
      }
    }
  }
}

}  // namespace kvs
