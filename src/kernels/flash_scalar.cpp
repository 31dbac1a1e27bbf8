// The scalar kernel of the tiled attention: the algorithm of
// flash_attention.h written out row by row. It is the Isa::Scalar path and
// the definition the SIMD kernels are tested against. Compiled with
// -ffp-contract=off (CMakeLists.txt) so no multiply and add are fused behind
// the definition's back.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu.h"
#include "kernels/exp_poly.h"
#include "kernels/flash_attention.h"

namespace kvs::attn {

namespace {

// State: qs [rows, hd], o [rows, hd], m [rows], l [rows].
struct ScalarState {
  float *qs, *o, *m, *l;
  ScalarState(const FlashQuery& fq, float* st) {
    const size_t n = size_t(fq.rows()) * fq.hd;
    qs = st;
    o = st + n;
    m = st + 2 * n;
    l = m + fq.rows();
  }
};

void begin_scalar(const FlashQuery& fq, float* state) {
  const ScalarState st(fq, state);
  const float c = fq.query_factor();
  for (int i = 0; i < fq.T; ++i)
    for (int j = 0; j < fq.r; ++j) {
      const int row = i * fq.r + j;
      const float* q = fq.q + size_t(i) * fq.ldq + size_t(j) * fq.hd;  // [hd]
      for (int d = 0; d < fq.hd; ++d) {
        st.qs[size_t(row) * fq.hd + d] = q[d] * c;
        st.o[size_t(row) * fq.hd + d] = 0.0f;
      }
      st.m[row] = -std::numeric_limits<float>::infinity();
      st.l[row] = 0.0f;
    }
}

// One row over one tile; bits: the keys it sees.
void tile_row(const FlashQuery& fq, const float* qs, float* o, float& m, float& l, const float* k, const float* v,
              unsigned bits) {
  const int hd = fq.hd;
  float s[kTile], p[kTile];
  float mt = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < kTile; ++t) {
    s[t] = -std::numeric_limits<float>::infinity();
    if (!(bits >> t & 1)) continue;
    float acc = 0.0f;
    for (int d = 0; d < hd; ++d) acc = std::fma(qs[d], k[size_t(t) * hd + d], acc);
    if (fq.softcap > 0.0f) acc = fq.cap_c1() - fq.cap_c2() / (1.0f + poly::exp_poly_scalar(acc));
    s[t] = acc;
    mt = std::max(mt, acc);
  }
  const float mn = std::max(m, mt);
  const float alpha = exp2n_scalar(m - mn);
  for (int t = 0; t < kTile; ++t) p[t] = (bits >> t & 1) ? exp2n_scalar(s[t] - mn) : 0.0f;
  l = std::fma(l, alpha, tree16_scalar(p));
  for (int d = 0; d < hd; ++d) {
    float od = o[d] * alpha;
    for (int t = 0; t < kTile; ++t)
      if (bits >> t & 1) od = std::fma(p[t], v[size_t(t) * hd + d], od);
    o[d] = od;
  }
  m = mn;
}

void tile_scalar(const FlashQuery& fq, float* state, const float* k, const float* v, const uint16_t* vis) {
  const ScalarState st(fq, state);
  for (int i = 0; i < fq.T; ++i) {
    const unsigned bits = vis ? vis[i] : 0xFFFFu;
    if (bits == 0) continue;  // the row is left as it is (flash_attention.h)
    for (int j = 0; j < fq.r; ++j) {
      const int row = i * fq.r + j;
      tile_row(fq, st.qs + size_t(row) * fq.hd, st.o + size_t(row) * fq.hd, st.m[row], st.l[row], k, v, bits);
    }
  }
}

void finish_scalar(const FlashQuery& fq, const float* state, float* out, size_t ldo) {
  const ScalarState st(fq, const_cast<float*>(state));
  for (int i = 0; i < fq.T; ++i)
    for (int j = 0; j < fq.r; ++j) {
      const int row = i * fq.r + j;
      float l = st.l[row], alpha = 1.0f;
      if (fq.sinks) {
        const float zs = fq.sinks[j] * kLog2e, mn = std::max(st.m[row], zs);
        alpha = exp2n_scalar(st.m[row] - mn);
        l = std::fma(l, alpha, exp2n_scalar(zs - mn));
      }
      const float inv = 1.0f / l;
      float* y = out + size_t(i) * ldo + size_t(j) * fq.hd;  // [hd]
      for (int d = 0; d < fq.hd; ++d) y[d] = (st.o[size_t(row) * fq.hd + d] * alpha) * inv;
    }
}

}  // namespace

const FlashKernel& flash_kernel_scalar() {
  static const FlashKernel k{begin_scalar, tile_scalar, finish_scalar};
  return k;
}

const FlashKernel& flash_kernel() {
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512: return flash_kernel_avx512();
    case Isa::Avx2: return flash_kernel_avx2();
    default: return flash_kernel_scalar();
  }
}

}  // namespace kvs::attn
