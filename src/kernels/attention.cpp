#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_simd.h"
#include "kernels/kv_codec.h"
#include "kernels/ops.h"

namespace kvs {

void attention_group(const float* q, const KvStorage& kv, int layer, const AttnSeq& seq, int g,
                     const AttnShape& s, float* out, float* scratch) {
  const int r = s.n_heads / s.n_kv_heads;
  const int hd = s.head_dim;
  const int bs = kv.layout.block_size;
  const int h0 = g * r;
  const int n_ctx = seq.n_ctx, n_st = seq.n_stored;
  const size_t kvdim = kv.layout.row_floats();
  const bool direct = kv.layout.type == KvType::F32;
  const attn::VecOps& ops = attn::vec_ops();
  float* sc = scratch;                       // [r, n_ctx] scores, then probabilities
  float* tile = scratch + size_t(r) * n_ctx;  // [block_size, head_dim] dequantized rows
  // Keys from storage, one block tile at a time (f32 is read in place).
  for (int t0 = 0; t0 < n_st; t0 += bs) {
    const int n = std::min(bs, n_st - t0);
    const int32_t b = seq.block_table[t0 / bs];
    if (!direct) kvc::load_k(kv, b, layer, g, 0, n, tile);
    for (int i = 0; i < n; ++i) {
      const float* k = direct ? kv.k(b, layer, i) + size_t(g) * hd : tile + size_t(i) * hd;  // [head_dim]
      for (int j = 0; j < r; ++j) sc[size_t(j) * n_ctx + t0 + i] = ops.dot(q + size_t(h0 + j) * hd, k, hd) * s.scale;
    }
  }
  for (int t = n_st; t < n_ctx; ++t) {
    const float* k = seq.own_k + size_t(t - n_st) * kvdim + size_t(g) * hd;  // [head_dim]
    for (int j = 0; j < r; ++j) sc[size_t(j) * n_ctx + t] = ops.dot(q + size_t(h0 + j) * hd, k, hd) * s.scale;
  }
  for (int j = 0; j < r; ++j) softmax_inplace(sc + size_t(j) * n_ctx, n_ctx);
  for (int j = 0; j < r; ++j) {
    float* o = out + size_t(h0 + j) * hd;  // [head_dim]
    for (int i = 0; i < hd; ++i) o[i] = 0.f;
  }
  for (int t0 = 0; t0 < n_st; t0 += bs) {
    const int n = std::min(bs, n_st - t0);
    const int32_t b = seq.block_table[t0 / bs];
    if (!direct) kvc::load_v(kv, b, layer, g, 0, n, tile);
    for (int i = 0; i < n; ++i) {
      const float* v = direct ? kv.v(b, layer, i) + size_t(g) * hd : tile + size_t(i) * hd;  // [head_dim]
      for (int j = 0; j < r; ++j) ops.axpy(sc[size_t(j) * n_ctx + t0 + i], v, out + size_t(h0 + j) * hd, hd);
    }
  }
  for (int t = n_st; t < n_ctx; ++t) {
    const float* v = seq.own_v + size_t(t - n_st) * kvdim + size_t(g) * hd;  // [head_dim]
    for (int j = 0; j < r; ++j) ops.axpy(sc[size_t(j) * n_ctx + t], v, out + size_t(h0 + j) * hd, hd);
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
