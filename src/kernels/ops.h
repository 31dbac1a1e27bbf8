// Element-wise and row-wise float ops of the transformer block. They are a
// small share of the time next to the matmuls, so they are written as plain
// loops the compiler vectorises; each works on one row so callers can
// parallelise over rows.
#pragma once
#include <cstdint>

namespace kvs {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]     x, w, out: [n]
void rmsnorm(const float* x, const float* w, float* out, int n, float eps);
// sum(x[i]^2) in double, x: [n]; the same bits on every ISA path (ops.cpp
// says the order).
double sum_squares(const float* x, int n);
double sum_squares_scalar(const float* x, int n);
// x[i] += y[i]
void add_inplace(float* x, const float* y, int n);
// g[i] = silu(g[i]) * u[i]   (SwiGLU), with the polynomial exp of
// exp_poly.h (rel. error < 1e-7): bit-identical on every ISA path.
void swiglu_inplace(float* g, const float* u, int n);
// g[i] = gelu_tanh(g[i]) * u[i]   (GeGLU, Gemma), by exp_poly.h's
// geglu_scalar: bit-identical on every ISA path.
void geglu_inplace(float* g, const float* u, int n);
// g[i] = clamped_swiglu(g[i], u[i])   (gpt-oss's experts), by exp_poly.h's
// clamped_swiglu_scalar: bit-identical on every ISA path.
void clamped_swiglu_inplace(float* g, const float* u, int n, float alpha, float limit);
// x[i] = cap * tanh(x[i] / cap)   (logit soft-capping, Gemma 2), by
// exp_poly.h's softcap_scalar: bit-identical on every ISA path.
void softcap_inplace(float* x, int n, float cap);
// In-place softmax of x[0..n); returns nothing, max-subtracted for stability.
void softmax_inplace(float* x, int n);

// Rotary embedding of one token. x: [n_heads, head_dim]; the first n_rot
// dims of each head are rotated. Neox pairs (i, i + n_rot/2); normal pairs
// (2i, 2i+1). Frequencies theta^(-2i/n_rot), angles computed in float as
// llama2.c / llama.cpp do.
struct RopeTable {
  // cos/sin for one position: [n_rot/2]
  void compute(int pos, int n_rot, float theta, float* cos_out, float* sin_out) const;
};
void rope_apply(float* x, int n_heads, int head_dim, int n_rot, bool neox, const float* cos_t,
                const float* sin_t);

}  // namespace kvs
