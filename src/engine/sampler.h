// Token sampling: logit bias and banned tokens, repetition / presence /
// frequency penalties, top-k, top-p, min-p, temperature, then a draw from a
// seeded generator (same seed + same logits = same token). temperature <= 0
// is greedy (argmax, lowest id on ties).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
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
  // OpenAI's definitions, over the tokens generated so far (not the prompt):
  // logit -= frequency_penalty * count + presence_penalty * (count > 0).
  float presence_penalty = 0, frequency_penalty = 0;
  // Added to a token's logit before anything else (OpenAI: -100 bans it).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// What one draw needs beyond the logits, all optional.
struct DrawContext {
  const std::vector<int>* history = nullptr;                  // prompt + generated: the repetition penalty
  const std::unordered_map<int32_t, int>* generated = nullptr;  // count per generated token: presence / frequency
  std::span<const int32_t> banned;                            // never drawn now (min_tokens: end-of-generation ids)
  const std::vector<uint64_t>* allowed = nullptr;             // one bit per token: only these (a grammar's mask)
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [n_vocab]; history: tokens so far (prompt + generated) for penalties.
  int sample(const float* logits, int n_vocab, const std::vector<int>& history);
  int sample_with(const float* logits, int n_vocab, const DrawContext& ctx);
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
  void adjust(int n_vocab, const DrawContext& ctx);  // bias, bans, penalties on cand_
};

int argmax(const float* x, int n);

}  // namespace kvs
