#include "kernels/attention.h"

#include <cmath>
#include <vector>

#include "kernels/attention_simd.h"
#include "kernels/ops.h"

namespace kvs {

void attention_group(const float* q, const KvStorage& kv, int layer, const int32_t* block_table,
                     int n_ctx, int g, const AttnShape& s, float* out, float* scratch) {
  const int r = s.n_heads / s.n_kv_heads;
  const int hd = s.head_dim;
  const int bs = kv.layout.block_size;
  const int h0 = g * r;
  const attn::VecOps& ops = attn::vec_ops();
  // scores: [r, n_ctx]
  for (int t = 0; t < n_ctx; ++t) {
    const float* k = kv.k(block_table[t / bs], layer, t % bs) + size_t(g) * hd;  // [head_dim]
    for (int j = 0; j < r; ++j) scratch[size_t(j) * n_ctx + t] = ops.dot(q + size_t(h0 + j) * hd, k, hd) * s.scale;
  }
  for (int j = 0; j < r; ++j) softmax_inplace(scratch + size_t(j) * n_ctx, n_ctx);
  for (int j = 0; j < r; ++j) {
    float* o = out + size_t(h0 + j) * hd;  // [head_dim]
    for (int i = 0; i < hd; ++i) o[i] = 0.f;
  }
  for (int t = 0; t < n_ctx; ++t) {
    const float* v = kv.v(block_table[t / bs], layer, t % bs) + size_t(g) * hd;  // [head_dim]
    for (int j = 0; j < r; ++j) {
      ops.axpy(scratch[size_t(j) * n_ctx + t], v, out + size_t(h0 + j) * hd, hd);
    }
  }
}

void attention_reference(const float* q, const float* k, const float* v, int n_ctx,
                         const AttnShape& s, float* out) {
  const int r = s.n_heads / s.n_kv_heads;
  const int hd = s.head_dim;
  std::vector<double> p(n_ctx);
  for (int h = 0; h < s.n_heads; ++h) {
    const int g = h / r;
    double mx = -1e300;
    for (int t = 0; t < n_ctx; ++t) {
      double d = 0;
      for (int i = 0; i < hd; ++i) d += double(q[h * hd + i]) * k[(size_t(t) * s.n_kv_heads + g) * hd + i];
      p[t] = d * s.scale;
      mx = p[t] > mx ? p[t] : mx;
    }
    double sum = 0;
    for (int t = 0; t < n_ctx; ++t) sum += (p[t] = std::exp(p[t] - mx));
    for (int i = 0; i < hd; ++i) {
      double o = 0;
      for (int t = 0; t < n_ctx; ++t) o += p[t] / sum * v[(size_t(t) * s.n_kv_heads + g) * hd + i];
      out[h * hd + i] = float(o);
    }
  }
}

}  // namespace kvs
