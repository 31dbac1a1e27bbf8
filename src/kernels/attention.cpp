#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_simd.h"
#include "kernels/kv_codec.h"
#include "kernels/ops.h"

namespace kvs {

namespace {

// Visits the visible keys in position order, one run of rows at a time:
// fn(first position, rows, row pointer, row stride in floats), where rows
// are [n, head_dim] of kv head g (rotated to their RoPE position when the
// keys are stored before RoPE). `tile` holds loaded rows ([block_size,
// head_dim]).
template <bool Keys, class Fn>
void visit_rows(const KvStorage& kv, int layer, const AttnSeq& q, int g, float* tile, Fn&& fn) {
  const int hd = kv.layout.head_dim, bs = kv.layout.block_size;
  const size_t kvdim = kv.layout.row_floats();
  const bool direct = kv.layout.type == KvType::F32;
  const bool rotate = Keys && q.rope_cos;
  const int half = q.n_rot / 2;
  auto rot = [&](float* rows, int n, int pos0) {
    for (int i = 0; i < n; ++i) {
      const int t = pos0 + i;
      const int pos = t < q.sink_end ? t : t - q.shift;
      rope_apply(rows + size_t(i) * hd, 1, hd, q.n_rot, q.neox, q.rope_cos + size_t(pos) * half, q.rope_sin + size_t(pos) * half);
    }
  };
  auto range = [&](int lo, int hi) {
    // Stored rows, block by block.
    for (int t = lo; t < std::min(hi, q.n_stored);) {
      const int32_t b = q.block_table[t / bs];
      const int slot = t % bs, n = std::min(bs - slot, std::min(hi, q.n_stored) - t);
      if (direct && !rotate) {
        const float* p = Keys ? kv.k(b, layer, slot) : kv.v(b, layer, slot);
        fn(t, n, p + size_t(g) * hd, kvdim);
      } else {
        if (Keys) kvc::load_k(kv, b, layer, g, slot, n, tile);
        else kvc::load_v(kv, b, layer, g, slot, n, tile);
        if (rotate) rot(tile, n, t);
        fn(t, n, tile, size_t(hd));
      }
      t += n;
    }
    // The residual group's rows, in full precision.
    const int from = std::max(lo, q.n_stored);
    if (from >= hi) return;
    const float* own = (Keys ? q.own_k : q.own_v) + size_t(from - q.n_stored) * kvdim + size_t(g) * hd;
    if (!rotate) {
      fn(from, hi - from, own, kvdim);
      return;
    }
    for (int t = from; t < hi; t += bs) {
      const int n = std::min(bs, hi - t);
      for (int i = 0; i < n; ++i) std::copy_n(own + size_t(t - from + i) * kvdim, hd, tile + size_t(i) * hd);
      rot(tile, n, t);
      fn(t, n, tile, size_t(hd));
    }
  };
  if (q.sink_end >= q.win_start) {
    range(0, q.n_ctx);
  } else {
    range(0, q.sink_end);
    range(q.win_start, q.n_ctx);
  }
}

}  // namespace

void attention_group_block(const float* q, size_t ldq, int T, const KvStorage& kv, int layer, const AttnSeq& seq,
                           int g, const AttnShape& s, float* out, size_t ldo, float* scratch) {
  const int r = s.n_heads / s.n_kv_heads;
  const int hd = s.head_dim;
  const int h0 = g * r;
  const int nv = seq.n_visible();
  // Token i sees the keys before its own context end (the last token: all).
  auto ctx_of = [&](int i) { return seq.n_ctx - (T - 1 - i); };
  const attn::VecOps& ops = attn::vec_ops();
  float* sc = scratch;                        // [T, r, n_visible] scores, then probabilities
  float* tile = scratch + size_t(T) * r * nv;  // [block_size, head_dim] loaded rows
  auto row = [&](int i) { return sc + size_t(i) * r * nv; };
  int col = 0;  // score column of the next visible key (the same for every token: no window here when T > 1)
  visit_rows<true>(kv, layer, seq, g, tile, [&](int t0, int n, const float* k, size_t ld) {
    for (int i = 0; i < T; ++i) {
      const int ni = std::min(n, ctx_of(i) - t0);  // T == 1: always n
      if (ni > 0) ops.scores(q + size_t(i) * ldq + size_t(h0) * hd, r, k, ld, ni, hd, s.scale, row(i) + col, size_t(nv));
    }
    col += n;
  });
  for (int i = 0; i < T; ++i) {
    const int ni = T == 1 ? nv : ctx_of(i);
    for (int j = 0; j < r; ++j) ops.softmax(row(i) + size_t(j) * nv, ni);
    float* o = out + size_t(i) * ldo + size_t(h0) * hd;  // [r, head_dim]
    for (int e = 0; e < r * hd; ++e) o[e] = 0.f;
  }
  col = 0;
  visit_rows<false>(kv, layer, seq, g, tile, [&](int t0, int n, const float* v, size_t ld) {
    for (int i = 0; i < T; ++i) {
      const int ni = std::min(n, ctx_of(i) - t0);
      if (ni > 0) ops.accum(row(i) + col, size_t(nv), r, v, ld, ni, hd, out + size_t(i) * ldo + size_t(h0) * hd);
    }
    col += n;
  });
}

void attention_group(const float* q, const KvStorage& kv, int layer, const AttnSeq& seq, int g,
                     const AttnShape& s, float* out, float* scratch) {
  attention_group_block(q, 0, 1, kv, layer, seq, g, s, out, 0, scratch);
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
