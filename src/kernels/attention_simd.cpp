#include "kernels/attention_simd.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu.h"
#include "kernels/ops.h"
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
void scores_scalar(const float* q, int R, const float* k, size_t ldk, int n, int hd, float scale, float* s, size_t lds) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < R; ++j) s[size_t(j) * lds + i] = dot_scalar(q + size_t(j) * hd, k + size_t(i) * ldk, hd) * scale;
}
void accum_scalar(const float* p, size_t ldp, int R, const float* v, size_t ldv, int n, int hd, float* out) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < R; ++j) axpy_scalar(p[size_t(j) * ldp + i], v + size_t(i) * ldv, out + size_t(j) * hd, hd);
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
void scores_avx2(const float* q, int R, const float* k, size_t ldk, int n, int hd, float scale, float* s, size_t lds) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < R; ++j) s[size_t(j) * lds + i] = dot_avx2(q + size_t(j) * hd, k + size_t(i) * ldk, hd) * scale;
}
// Output rows stay in registers over the run when head_dim is 64 or less
// (4 rows x 8 floats x up to 8 vectors would not fit: rows go one at a time).
void accum_avx2(const float* p, size_t ldp, int R, const float* v, size_t ldv, int n, int hd, float* out) {
  if (hd % 8 != 0 || hd > 64) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < R; ++j) axpy_avx2(p[size_t(j) * ldp + i], v + size_t(i) * ldv, out + size_t(j) * hd, hd);
    return;
  }
  const int nv = hd / 8;
  for (int j = 0; j < R; ++j) {
    __m256 acc[8];
    float* o = out + size_t(j) * hd;
    for (int c = 0; c < nv; ++c) acc[c] = _mm256_loadu_ps(o + 8 * c);
    const float* pj = p + size_t(j) * ldp;
    for (int i = 0; i < n; ++i) {
      const __m256 a = _mm256_broadcast_ss(pj + i);
      const float* vi = v + size_t(i) * ldv;
      for (int c = 0; c < nv; ++c) acc[c] = _mm256_fmadd_ps(a, _mm256_loadu_ps(vi + 8 * c), acc[c]);
    }
    for (int c = 0; c < nv; ++c) _mm256_storeu_ps(o + 8 * c, acc[c]);
  }
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
void axpy_avx512(float a, const float* x, float* y, int n);
// exp(x) for x <= 0 (softmax after subtracting the max): 2^(x log2 e) with
// a degree-6 polynomial for 2^f, f in [-0.5, 0.5]; relative error < 2e-7.
inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 y = _mm512_set1_ps(1.535336188319500e-4f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.339887440266574e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.618437357674640e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.550332471162809e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.402264791363012e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.931472028550421e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}
void softmax_avx512(float* x, int n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 16 <= n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
  float m = _mm512_reduce_max_ps(mx);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  const __m512 vm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 k = __mmask16((1u << (n - i)) - 1);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
    _mm512_mask_storeu_ps(x + i, k, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (i < n) {
    const __mmask16 k = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
  }
}
// Sum of each of 16 vectors, lane t = key t, by a fixed tree that is the
// same for every key (lanes l + 8, then + 4, + 2, + 1), so a key's score
// does not depend on its neighbours in the tile.
inline __m512 reduce16(__m512* a) {
  __m512 c[8], e[4], g[2];
  for (int m = 0; m < 8; ++m)
    c[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int p = 0; p < 4; ++p)
    e[p] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int u = 0; u < 2; ++u)
    g[u] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * u], e[2 * u + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(e[2 * u], e[2 * u + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 h = _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // Lane 4k + e of h holds key 4e + k.
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(idx, h);
}
// Scores, head_dim a multiple of 16 up to 128: 16 keys per tile, each key's
// 16-lane partial sums reduced together (reduce16). NV is a template
// argument so the tile's 16 accumulators and the query stay in registers
// (with a run-time NV the compiler kept them on the stack: 2x slower).
template <int NV>
inline void score_tile(const __m512* qv, const float* k, size_t ldk, int m, __m512 vs, float* s) {
  __m512 acc[16];
  for (int t = 0; t < 16; ++t) {
    acc[t] = _mm512_setzero_ps();
    if (m == 16 || t < m) {
      const float* kt = k + size_t(t) * ldk;
      for (int c = 0; c < NV; ++c) acc[t] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kt + 16 * c), acc[t]);
    }
  }
  _mm512_mask_storeu_ps(s, __mmask16((1u << m) - 1), _mm512_mul_ps(reduce16(acc), vs));
}
template <int NV>
void scores_tiled_avx512(const float* q, int R, const float* k, size_t ldk, int n, float scale, float* s,
                         size_t lds) {
  const __m512 vs = _mm512_set1_ps(scale);
  for (int j = 0; j < R; ++j) {
    __m512 qv[NV];
    for (int c = 0; c < NV; ++c) qv[c] = _mm512_loadu_ps(q + size_t(j) * NV * 16 + 16 * c);
    for (int i0 = 0; i0 < n; i0 += 16) {
      const int m = std::min(16, n - i0);
      if (m == 16) score_tile<NV>(qv, k + size_t(i0) * ldk, ldk, 16, vs, s + size_t(j) * lds + i0);
      else score_tile<NV>(qv, k + size_t(i0) * ldk, ldk, m, vs, s + size_t(j) * lds + i0);
    }
  }
}
// Scores: each dot as dot_avx512 computes it (16-wide accumulation, one
// reduction); four query rows share each loaded key row.
void scores_avx512(const float* q, int R, const float* k, size_t ldk, int n, int hd, float scale, float* s, size_t lds) {
  const int nv = (hd + 15) / 16;
  if (hd % 16 == 0 && nv <= 8) {
    switch (nv) {
      case 1: return scores_tiled_avx512<1>(q, R, k, ldk, n, scale, s, lds);
      case 2: return scores_tiled_avx512<2>(q, R, k, ldk, n, scale, s, lds);
      case 3: return scores_tiled_avx512<3>(q, R, k, ldk, n, scale, s, lds);
      case 4: return scores_tiled_avx512<4>(q, R, k, ldk, n, scale, s, lds);
      case 5: return scores_tiled_avx512<5>(q, R, k, ldk, n, scale, s, lds);
      case 6: return scores_tiled_avx512<6>(q, R, k, ldk, n, scale, s, lds);
      case 7: return scores_tiled_avx512<7>(q, R, k, ldk, n, scale, s, lds);
      default: return scores_tiled_avx512<8>(q, R, k, ldk, n, scale, s, lds);
    }
  }
  if (nv > 8) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < R; ++j) s[size_t(j) * lds + i] = dot_avx512(q + size_t(j) * hd, k + size_t(i) * ldk, hd) * scale;
    return;
  }
  const __mmask16 tail = hd % 16 ? __mmask16((1u << (hd % 16)) - 1) : __mmask16(0xFFFF);
  for (int i = 0; i < n; ++i) {
    const float* ki = k + size_t(i) * ldk;
    __m512 kv[8];
    for (int c = 0; c < nv; ++c) kv[c] = _mm512_maskz_loadu_ps(c + 1 == nv ? tail : __mmask16(0xFFFF), ki + 16 * c);
    for (int j = 0; j < R; ++j) {
      const float* qj = q + size_t(j) * hd;
      __m512 acc = _mm512_setzero_ps();
      for (int c = 0; c < nv; ++c)
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(c + 1 == nv ? tail : __mmask16(0xFFFF), qj + 16 * c), kv[c], acc);
      s[size_t(j) * lds + i] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
}
// Accumulation: HB heads' output rows stay in registers over the run of
// keys and share each loaded value row (HB x NV independent fma chains hide
// the latency). Per element the sum is over the keys in order, as in axpy,
// so grouping heads changes no bit.
template <int HB, int NV>
void accum_heads_avx512(const float* p, size_t ldp, const float* v, size_t ldv, int n, __mmask16 tail, float* out,
                        int hd) {
  __m512 acc[HB][NV];
  for (int j = 0; j < HB; ++j)
    for (int c = 0; c < NV; ++c)
      acc[j][c] = _mm512_maskz_loadu_ps(c + 1 == NV ? tail : __mmask16(0xFFFF), out + size_t(j) * hd + 16 * c);
  for (int i = 0; i < n; ++i) {
    const float* vi = v + size_t(i) * ldv;
    __m512 vv[NV];
    for (int c = 0; c < NV; ++c) vv[c] = _mm512_maskz_loadu_ps(c + 1 == NV ? tail : __mmask16(0xFFFF), vi + 16 * c);
    for (int j = 0; j < HB; ++j) {
      const __m512 a = _mm512_set1_ps(p[size_t(j) * ldp + i]);
      for (int c = 0; c < NV; ++c) acc[j][c] = _mm512_fmadd_ps(a, vv[c], acc[j][c]);
    }
  }
  for (int j = 0; j < HB; ++j)
    for (int c = 0; c < NV; ++c)
      _mm512_mask_storeu_ps(out + size_t(j) * hd + 16 * c, c + 1 == NV ? tail : __mmask16(0xFFFF), acc[j][c]);
}
// Heads in groups of up to 4 (NV <= 4) or 2 (NV <= 8): at most 16 accumulators.
template <int NV>
void accum_nv_avx512(const float* p, size_t ldp, int R, const float* v, size_t ldv, int n, int hd, __mmask16 tail,
                     float* out) {
  constexpr int kMax = NV <= 4 ? 4 : 2;
  int j = 0;
  for (; j + kMax <= R; j += kMax)
    accum_heads_avx512<kMax, NV>(p + size_t(j) * ldp, ldp, v, ldv, n, tail, out + size_t(j) * hd, hd);
  for (; j + 2 <= R; j += 2) accum_heads_avx512<2, NV>(p + size_t(j) * ldp, ldp, v, ldv, n, tail, out + size_t(j) * hd, hd);
  for (; j < R; ++j) accum_heads_avx512<1, NV>(p + size_t(j) * ldp, ldp, v, ldv, n, tail, out + size_t(j) * hd, hd);
}
void accum_avx512(const float* p, size_t ldp, int R, const float* v, size_t ldv, int n, int hd, float* out) {
  const int nv = (hd + 15) / 16;
  const __mmask16 tail = hd % 16 ? __mmask16((1u << (hd % 16)) - 1) : __mmask16(0xFFFF);
  switch (nv) {
    case 1: return accum_nv_avx512<1>(p, ldp, R, v, ldv, n, hd, tail, out);
    case 2: return accum_nv_avx512<2>(p, ldp, R, v, ldv, n, hd, tail, out);
    case 3: return accum_nv_avx512<3>(p, ldp, R, v, ldv, n, hd, tail, out);
    case 4: return accum_nv_avx512<4>(p, ldp, R, v, ldv, n, hd, tail, out);
    case 5: return accum_nv_avx512<5>(p, ldp, R, v, ldv, n, hd, tail, out);
    case 6: return accum_nv_avx512<6>(p, ldp, R, v, ldv, n, hd, tail, out);
    case 7: return accum_nv_avx512<7>(p, ldp, R, v, ldv, n, hd, tail, out);
    case 8: return accum_nv_avx512<8>(p, ldp, R, v, ldv, n, hd, tail, out);
    default:
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < R; ++j) axpy_avx512(p[size_t(j) * ldp + i], v + size_t(i) * ldv, out + size_t(j) * hd, hd);
  }
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
  static const VecOps v{dot_scalar, axpy_scalar, scores_scalar, accum_scalar, softmax_inplace};
  return v;
}
const VecOps& vec_ops_avx2() {
  static const VecOps v{dot_avx2, axpy_avx2, scores_avx2, accum_avx2, softmax_inplace};
  return v;
}
const VecOps& vec_ops_avx512() {
  static const VecOps v{dot_avx512, axpy_avx512, scores_avx512, accum_avx512, softmax_avx512};
  return v;
}

const VecOps& vec_ops() {
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512: return vec_ops_avx512();
    case Isa::Avx2: return vec_ops_avx2();
    default: return vec_ops_scalar();
  }
}

}  // namespace kvs::attn
