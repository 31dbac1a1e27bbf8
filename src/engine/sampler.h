// Token sampling: repetition penalty, top-k, top-p, min-p, temperature, then
// a draw from a seeded generator (same seed + same logits = same token).
// temperature <= 0 is greedy (argmax, lowest id on ties).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace kvs {

struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;              // <= 0: off
  float top_p = 0.95f;         // >= 1: off
  float min_p = 0.05f;         // <= 0: off
  float repeat_penalty = 1.0f; // 1: off (llama.cpp semantics: divide positive logits, multiply negative)
  int repeat_last_n = 64;      // window of previous tokens the penalty looks at
  uint64_t seed = 0;           // fixed seed (generate picks a random one when the user gives none)
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [n_vocab]; history: tokens so far (prompt + generated) for penalties.
  int sample(const float* logits, int n_vocab, const std::vector<int>& history);
  const SamplingParams& params() const { return p_; }
  // Random draws made so far, and skipping draws another sampler of the same
  // seed made: a request continued elsewhere keeps one random stream.
  uint64_t draws() const { return draws_; }
  void advance(uint64_t draws);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  uint64_t draws_ = 0;
  std::vector<std::pair<float, int>> cand_;  // (logit, id) candidates
  double uniform();
};

int argmax(const float* x, int n);

}  // namespace kvs
