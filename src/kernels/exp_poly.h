// The float exp of SwiGLU (ops.h):
//   x clamped to [-87, 88]; n = nearest integer to x * log2(e);
//   r = x - n * ln2, in two fma steps (ln2 split hi + lo, Cody-Waite), so r
//   in [-0.35, 0.35] carries no rounding of the large n * ln2;
//   p = degree-7 Taylor polynomial of e^r (Horner, fma); exp(x) = p * 2^n.
// Relative error <= 7.7e-8 (a 1e-4 grid over the range against double exp).
// Every ISA runs exactly these IEEE operations in this order, so scalar,
// AVX2 and AVX-512 agree bit for bit; exp_poly_scalar() is the definition
// the SIMD versions are tested against. (The attention softmax has its own exp for x <= 0.)
#pragma once
#include <algorithm>
#include <cmath>

namespace kvs::poly {

constexpr float kExpLo = -87.0f, kExpHi = 88.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;      // 0x3f317200: n * kLn2Hi is exact
constexpr float kLn2Lo = 1.428606765330187e-06f;  // ln 2 - kLn2Hi
// e^r, highest degree first: 1/7!, 1/6!, ..., 1/1!, 1.
constexpr float kExpR[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                            1.0f / 6,    0.5f,       1.0f,       1.0f};

inline float exp_poly_scalar(float x) {
  x = x > kExpLo ? x : kExpLo;  // vmaxps(x, lo): a NaN becomes lo, as in SIMD
  x = x < kExpHi ? x : kExpHi;
  const float n = std::nearbyint(x * kLog2e);  // ties to even, as roundscale under default MXCSR
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float y = kExpR[0];
  for (int i = 1; i < 8; ++i) y = std::fma(y, r, kExpR[i]);
  return std::ldexp(y, int(n));  // exact: y * 2^n stays normal in the clamped range
}

// silu(v) * u = v / (1 + exp(-v)) * u, in this order.
inline float swiglu_scalar(float v, float u) { return v / (1.0f + exp_poly_scalar(-v)) * u; }

// GeGLU with the tanh-approximated GELU (Gemma):
//   gelu(v) = 0.5 v (1 + tanh(sqrt(2/pi) v (1 + A v^2))) = v / (1 + exp(z)),
//   z = -2 sqrt(2/pi) v (1 + A v^2)   (0.5 (1 + tanh y) is the sigmoid of 2y)
// computed as z = (v * kGeluK) * fma(A, v * v, 1), then v / (1 + exp(z)) * u.
constexpr float kGeluK = -1.5957691216057308f;  // -2 sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
inline float geglu_scalar(float v, float u) {
  const float z = (v * kGeluK) * std::fma(kGeluA, v * v, 1.0f);
  return v / (1.0f + exp_poly_scalar(z)) * u;
}

// Soft-capping (Gemma 2's logits): cap * tanh(x / cap), as
// cap - 2 cap / (1 + exp(x * (2 / cap))). The constants are the caller's
// floats: k = 2 / cap, c = cap, c2 = 2 * cap.
struct Softcap {
  float k = 0, c = 0, c2 = 0;
  explicit Softcap(float cap) : k(2.0f / cap), c(cap), c2(2.0f * cap) {}
};
inline float softcap_scalar(float x, const Softcap& s) { return s.c - s.c2 / (1.0f + exp_poly_scalar(x * s.k)); }

// gpt-oss's clamped SwiGLU: the gate clamped above, the linear half on both
// sides and shifted by one:
//   x = min(v, limit), y = clamp(u, -limit, limit),
//   out = x / (1 + exp(alpha * -x)) * (y + 1)
// min/max as std::min/max (a NaN gate stays NaN; SIMD takes (limit, v)).
inline float clamped_swiglu_scalar(float v, float u, float alpha, float limit) {
  const float x = std::min(v, limit);
  const float y = std::max(std::min(u, limit), -limit);
  return x / (1.0f + exp_poly_scalar(alpha * -x)) * (y + 1.0f);
}

}  // namespace kvs::poly
