// Mixture-of-experts FFN: routing, tokens grouped by expert, grouped expert
// products, and the per-token weighted sum in a fixed order (moe_ffn.h).
#include "engine/moe_ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "kernels/exp_poly.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/threadpool.h"

namespace kvs {

namespace {

// y = softmax(x) over n as ggml computes it: exp(x - max) in float, their
// sum in double, then one multiply by the float reciprocal.
void softmax_to(const float* x, int n, float* y) {
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - mx);
    sum += double(y[i]);
  }
  const float inv = float(1.0 / sum);
  for (int i = 0; i < n; ++i) y[i] *= inv;
}

// The k best of s[0..n) (n <= kMaxExperts): descending score, ties to the
// lower index. A NaN score never wins but is still picked when nothing else
// is left, so every id is a valid expert whatever the input.
void top_k(const float* s, int n, int k, int32_t* ids) {
  uint64_t taken[kMaxExperts / 64] = {};
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < n; ++e) {
      if (taken[e / 64] >> (e % 64) & 1) continue;
      const bool nan_best = best >= 0 && s[best] != s[best];  // any number beats a NaN
      if (best < 0 || s[e] > s[best] || (nan_best && s[e] == s[e])) best = e;
    }
    ids[j] = best;
    taken[best / 64] |= uint64_t(1) << (best % 64);
  }
}

// w[0..k) /= their sum (double accumulation, then one float divisor).
void normalize(float* w, int k) {
  double sum = 0.0;
  for (int j = 0; j < k; ++j) sum += double(w[j]);
  const float s = float(sum);
  for (int j = 0; j < k; ++j) w[j] = w[j] / s;
}

void add_row(float* y, const float* b, int n) {
  for (int i = 0; i < n; ++i) y[i] += b[i];
}

// The shared expert's weight: sigmoid(x · g), the dot in double.
float shared_gate(const float* x, const float* g, int dim) {
  if (!g) return 1.0f;
  double acc = 0.0;
  for (int i = 0; i < dim; ++i) acc += double(x[i]) * double(g[i]);
  return 1.0f / (1.0f + std::exp(-float(acc)));
}

// Y = X · W^T: the engine's rule (exact: quantized weights dequantized, float activations).
void product(const WeightView& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, ThreadPool& pool,
             bool exact) {
  if (exact && w.type != GgmlType::F32 && w.type != GgmlType::F16 && w.type != GgmlType::BF16)
    matmul_reference(w, x, ldx, n, y, ldy);
  else
    matmul(w, x, ldx, n, y, ldy, pool);
}

void products(const std::vector<MatmulGroup>& gs, ThreadPool& pool, bool exact) {
  if (!exact) return matmul_grouped(gs.data(), int(gs.size()), pool);
  for (const MatmulGroup& g : gs) product(*g.w, g.x, g.ldx, g.n, g.y, g.ldy, pool, true);
}

// fn(i, thread) for i in [0, n), each item about `work` floats of work:
// over the pool when that pays for a dispatch (a decode step's few rows run
// inline). Items are independent, so the split never changes a bit.
template <class Fn>
void each(ThreadPool& pool, int64_t n, int64_t work, const Fn& fn) {
  constexpr int64_t kMinParallelWork = 1 << 15;
  if (n > 1 && n * work >= kMinParallelWork) pool.parallel_for(n, [&](int64_t i, int thread) { fn(i, thread); });
  else
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
}

}  // namespace

void moe_route(const MoeConfig& c, const float* logits, int32_t* ids, float* weights, float* scratch) {
  const int E = c.n_expert, K = c.n_used;
  if (c.gating == MoeGating::SoftmaxTopK) {
    softmax_to(logits, E, scratch);  // [n_expert] probabilities
    top_k(scratch, E, K, ids);
    for (int j = 0; j < K; ++j) weights[j] = scratch[ids[j]];
    if (c.norm_weights) normalize(weights, K);
  } else {
    top_k(logits, E, K, ids);
    for (int j = 0; j < K; ++j) scratch[j] = logits[ids[j]];
    softmax_to(scratch, K, weights);
  }
}

void moe_activation(const MoeConfig& c, float* g, const float* u, int n) {
  if (c.act == MoeActivation::SwiGLU) return swiglu_inplace(g, u, n);
  clamped_swiglu_inplace(g, u, n, c.clamp_alpha, c.clamp_limit);
}

void MoeFfn::forward(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, float* out,
                     ThreadPool& pool, bool exact) {
  if (T <= 0) return;
  route(c, w, xn, T, dim, pool, exact);
  group(c, xn, T, dim, pool);
  experts(c, w, xn, T, dim, pool, exact);
  combine(c, w, xn, T, dim, out, pool);
}

// Router logits [T, E] and each token's experts and weights [T, K].
void MoeFfn::route(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, ThreadPool& pool,
                   bool exact) {
  const int E = c.n_expert, K = c.n_used;
  logits_.resize(size_t(T * E));
  product(w.router, xn, dim, T, logits_.data(), E, pool, exact);
  ids_.resize(size_t(T * K));
  weights_.resize(size_t(T * K));
  route_scratch_.resize(size_t(pool.size()) * E);
  each(pool, T, int64_t(E) * 8, [&](int64_t t, int thread) {
    float* lg = &logits_[size_t(t * E)];
    if (w.router_bias) add_row(lg, w.router_bias, E);
    moe_route(c, lg, &ids_[size_t(t * K)], &weights_[size_t(t * K)], &route_scratch_[size_t(thread) * E]);
  });
}

// The (token, expert) pairs sorted by expert, tokens in batch order within
// an expert (a counting sort), and each pair's input row gathered there.
void MoeFfn::group(const MoeConfig& c, const float* xn, int64_t T, int dim, ThreadPool& pool) {
  const int E = c.n_expert, K = c.n_used;
  const int64_t P = T * K;
  first_.assign(size_t(E) + 1, 0);
  for (int64_t p = 0; p < P; ++p) ++first_[size_t(ids_[size_t(p)]) + 1];
  std::partial_sum(first_.begin(), first_.end(), first_.begin());
  row_of_.resize(size_t(P));
  token_of_.resize(size_t(P));
  expert_of_.resize(size_t(P));
  cursor_.assign(first_.begin(), first_.end() - 1);
  for (int64_t p = 0; p < P; ++p) {
    const int e = ids_[size_t(p)];
    const int64_t r = cursor_[size_t(e)]++;
    row_of_[size_t(p)] = r;
    token_of_[size_t(r)] = int32_t(p / K);
    expert_of_[size_t(r)] = e;
  }
  xg_.resize(size_t(P) * dim);  // [P, dim]
  each(pool, P, dim, [&](int64_t r, int) {
    std::copy_n(xn + int64_t(token_of_[size_t(r)]) * dim, dim, &xg_[size_t(r) * dim]);
  });
}

// Gate/up of every active expert and the shared one in one dispatch, the
// activations, then every down product in another.
void MoeFfn::experts(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, ThreadPool& pool,
                     bool exact) {
  const int E = c.n_expert, F = c.ffn_dim, SF = c.shared_ffn_dim;
  const int64_t P = T * c.n_used;
  const bool shared = w.sh_gate.data != nullptr;
  hg_.resize(size_t(P) * F);  // [P, ffn_exp]
  ug_.resize(size_t(P) * F);
  dg_.resize(size_t(P) * dim);  // [P, dim]
  if (shared) {
    sg_.resize(size_t(T) * SF);  // [T, shared_ffn]
    su_.resize(size_t(T) * SF);
    sd_.resize(size_t(T) * dim);  // [T, dim]
  }
  groups_.clear();
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = first_[size_t(e)], n = first_[size_t(e) + 1] - r0;
    if (n == 0) continue;
    groups_.push_back({&w.gate[size_t(e)], &xg_[size_t(r0) * dim], dim, n, &hg_[size_t(r0) * F], F});
    groups_.push_back({&w.up[size_t(e)], &xg_[size_t(r0) * dim], dim, n, &ug_[size_t(r0) * F], F});
  }
  if (shared) {
    groups_.push_back({&w.sh_gate, xn, dim, T, sg_.data(), SF});
    groups_.push_back({&w.sh_up, xn, dim, T, su_.data(), SF});
  }
  products(groups_, pool, exact);
  each(pool, P, int64_t(F) * 8, [&](int64_t r, int) {
    float* h = &hg_[size_t(r) * F];
    float* u = &ug_[size_t(r) * F];
    const int64_t e = expert_of_[size_t(r)];
    if (w.gate_bias) add_row(h, w.gate_bias + e * F, F);
    if (w.up_bias) add_row(u, w.up_bias + e * F, F);
    moe_activation(c, h, u, F);
  });
  if (shared)
    each(pool, T, int64_t(SF) * 8, [&](int64_t t, int) { swiglu_inplace(&sg_[size_t(t) * SF], &su_[size_t(t) * SF], SF); });
  groups_.clear();
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = first_[size_t(e)], n = first_[size_t(e) + 1] - r0;
    if (n > 0) groups_.push_back({&w.down[size_t(e)], &hg_[size_t(r0) * F], F, n, &dg_[size_t(r0) * dim], dim});
  }
  if (shared) groups_.push_back({&w.sh_down, sg_.data(), SF, T, sd_.data(), dim});
  products(groups_, pool, exact);
}

// Each token: its experts in its own order, then the shared expert.
void MoeFfn::combine(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, float* out,
                     ThreadPool& pool) {
  const int K = c.n_used;
  each(pool, T, int64_t(dim) * (K + 1), [&](int64_t t, int) {
    float* o = out + t * dim;  // [dim]
    for (int j = 0; j < K; ++j) {
      const int64_t r = row_of_[size_t(t * K + j)];
      float* d = &dg_[size_t(r) * dim];
      if (w.down_bias) add_row(d, w.down_bias + int64_t(expert_of_[size_t(r)]) * dim, dim);
      const float wj = weights_[size_t(t * K + j)];
      if (j == 0)
        for (int i = 0; i < dim; ++i) o[i] = d[i] * wj;
      else
        for (int i = 0; i < dim; ++i) o[i] = o[i] + d[i] * wj;
    }
    if (w.sh_gate.data) {
      const float g = shared_gate(xn + t * dim, w.sh_gate_inp, dim);
      const float* s = &sd_[size_t(t) * dim];
      for (int i = 0; i < dim; ++i) o[i] = o[i] + s[i] * g;
    }
  });
}

void moe_ffn_reference(const MoeConfig& c, const MoeWeights& w, const float* xn, int64_t T, int dim, float* out) {
  const int E = c.n_expert, K = c.n_used, F = c.ffn_dim, SF = c.shared_ffn_dim;
  std::vector<float> logits(E), score(E), wk(K), h(F), u(F), d(dim), sh(SF), su(SF), sd(dim);
  std::vector<int> order(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* x = xn + t * dim;
    float* o = out + t * dim;
    matmul_q8_reference(w.router, x, dim, 1, logits.data(), E);
    if (w.router_bias)
      for (int e = 0; e < E; ++e) logits[e] += w.router_bias[e];
    // Routing with a full stable sort (descending score, ties to the lower id).
    if (c.gating == MoeGating::SoftmaxTopK) softmax_to(logits.data(), E, score.data());
    else score = logits;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
    if (c.gating == MoeGating::SoftmaxTopK) {
      for (int j = 0; j < K; ++j) wk[j] = score[order[j]];
      if (c.norm_weights) normalize(wk.data(), K);
    } else {
      std::vector<float> top(K);
      for (int j = 0; j < K; ++j) top[j] = logits[order[j]];
      softmax_to(top.data(), K, wk.data());
    }
    for (int j = 0; j < K; ++j) {
      const int e = order[j];
      matmul_q8_reference(w.gate[e], x, dim, 1, h.data(), F);
      matmul_q8_reference(w.up[e], x, dim, 1, u.data(), F);
      if (w.gate_bias) add_row(h.data(), w.gate_bias + int64_t(e) * F, F);
      if (w.up_bias) add_row(u.data(), w.up_bias + int64_t(e) * F, F);
      moe_activation(c, h.data(), u.data(), F);
      matmul_q8_reference(w.down[e], h.data(), F, 1, d.data(), dim);
      if (w.down_bias) add_row(d.data(), w.down_bias + int64_t(e) * dim, dim);
      for (int i = 0; i < dim; ++i) o[i] = j == 0 ? d[i] * wk[j] : o[i] + d[i] * wk[j];
    }
    if (w.sh_gate.data) {
      matmul_q8_reference(w.sh_gate, x, dim, 1, sh.data(), SF);
      matmul_q8_reference(w.sh_up, x, dim, 1, su.data(), SF);
      swiglu_inplace(sh.data(), su.data(), SF);
      matmul_q8_reference(w.sh_down, sh.data(), SF, 1, sd.data(), dim);
      const float g = shared_gate(x, w.sh_gate_inp, dim);
      for (int i = 0; i < dim; ++i) o[i] = o[i] + sd[i] * g;
    }
  }
}

}  // namespace kvs
