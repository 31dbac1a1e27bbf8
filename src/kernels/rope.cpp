#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kvs {

namespace {

// The pair index where YaRN's ramp starts (or ends) for `rot` rotations over
// the original context: n_rot * ln(n_ctx_orig / (rot * 2 pi)) / (2 ln base).
float yarn_corr_dim(int n_rot, int n_ctx_orig, float rot, float base) {
  return float(n_rot) * std::log(float(n_ctx_orig) / (rot * 2.f * std::numbers::pi_v<float>)) / (2.f * std::log(base));
}

}  // namespace

RopeFreqs::RopeFreqs(const RopeConfig& c, int n_rot, const float* factors) : n_rot_(n_rot) {
  const int half = n_rot / 2;
  inv_.resize(size_t(half));
  for (int i = 0; i < half; ++i) {
    // RopeTable's expression, so the plain case keeps its bits.
    inv_[size_t(i)] = 1.0f / std::pow(c.theta, float(2 * i) / float(n_rot));
    if (factors) inv_[size_t(i)] /= factors[i];
  }
  freq_scale_ = c.freq_scale;
  mscale_ = c.attn_factor;
  if (c.ext_factor != 0.f) {
    const float lo = std::max(0.f, std::floor(yarn_corr_dim(n_rot, c.n_ctx_orig, c.beta_fast, c.theta)));
    const float hi = std::min(float(n_rot - 1), std::ceil(yarn_corr_dim(n_rot, c.n_ctx_orig, c.beta_slow, c.theta)));
    mix_.resize(size_t(half));
    for (int i = 0; i < half; ++i) {
      const float y = (float(i) - lo) / std::max(0.001f, hi - lo);
      mix_[size_t(i)] = (1.f - std::min(1.f, std::max(0.f, y))) * c.ext_factor;
    }
    mscale_ *= 1.0f + 0.1f * std::log(1.0f / c.freq_scale);
  }
}

void RopeFreqs::compute(int pos, float* cos_out, float* sin_out) const {
  const int half = n_rot_ / 2;
  for (int i = 0; i < half; ++i) {
    const float extrap = float(pos) * inv_[size_t(i)];
    float a = freq_scale_ * extrap;  // exact when the scale is 1
    if (!mix_.empty()) a = a * (1.f - mix_[size_t(i)]) + extrap * mix_[size_t(i)];
    cos_out[i] = std::cos(a) * mscale_;
    sin_out[i] = std::sin(a) * mscale_;
  }
}

}  // namespace kvs
