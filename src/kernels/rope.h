// RoPE frequencies of one kind of layer, with the scalings GGUF files ask
// for: per-dimension frequency factors (Llama 3.1's rope_freqs, Phi-3's
// LongRoPE factors), linear position scaling, YaRN, and an attention factor
// on cos / sin. The angle of pair i at position p, as ggml computes it:
//   extrap = p * base^(-2i / n_rot) / factor_i
//   interp = freq_scale * extrap
//   angle  = interp                                   (no YaRN)
//          = interp * (1 - mix_i) + extrap * mix_i    (YaRN: mix_i = ramp_i * ext_factor)
//   cos, sin = cos(angle) * mscale, sin(angle) * mscale
//   mscale = attn_factor, times 1 + 0.1 ln(1 / freq_scale) under YaRN.
// With the defaults (no factors, scale 1, no YaRN, factor 1) this is
// exactly RopeTable (ops.h), bit for bit: the models that have none of
// these keys compute what they always did.
#pragma once
#include <vector>

namespace kvs {

struct RopeConfig {
  float theta = 10000.f;     // frequency base (rope.freq_base)
  float freq_scale = 1.f;    // 1 / rope.scaling.factor (linear and YaRN)
  float ext_factor = 0.f;    // YaRN mix strength: 1 for rope.scaling.type yarn, else 0
  float attn_factor = 1.f;   // rope.scaling.attn_factor (LongRoPE, YaRN)
  float beta_fast = 32.f;    // YaRN ramp ends (llama.cpp's defaults)
  float beta_slow = 1.f;
  int n_ctx_orig = 0;        // YaRN: rope.scaling.original_context_length
  bool operator==(const RopeConfig&) const = default;
};

class RopeFreqs {
 public:
  RopeFreqs() = default;
  // factors: [n_rot / 2] frequency divisors, or null.
  RopeFreqs(const RopeConfig& c, int n_rot, const float* factors);
  // cos / sin of every pair at position pos: [n_rot / 2] each.
  void compute(int pos, float* cos_out, float* sin_out) const;
  int n_rot() const { return n_rot_; }

 private:
  int n_rot_ = 0;
  std::vector<float> inv_;  // [n_rot / 2] base^(-2i / n_rot) / factor_i
  std::vector<float> mix_;  // [n_rot / 2] YaRN mix; empty without YaRN
  float freq_scale_ = 1.f, mscale_ = 1.f;
};

}  // namespace kvs
