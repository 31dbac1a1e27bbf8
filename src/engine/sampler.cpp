#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "tokenizer/vocab.h"

namespace kvs {

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

double Sampler::uniform() {
  ++draws_;
  return double(rng_() >> 11) * 0x1.0p-53;
}

void Sampler::advance(uint64_t draws) {
  rng_.discard(draws);
  draws_ += draws;
}

int Sampler::sample(const float* logits, int n_vocab, const std::vector<int>& history) {
  DrawContext ctx;
  ctx.history = &history;
  return sample_with(logits, n_vocab, ctx);
}

void Sampler::adjust(int n_vocab, const DrawContext& ctx) {
  for (const auto& [id, b] : p_.logit_bias)
    if (token_in_vocab(id, n_vocab)) cand_[size_t(id)].first += b;
  if (ctx.history && p_.repeat_penalty != 1.0f && p_.repeat_last_n != 0) {
    const std::vector<int>& history = *ctx.history;
    const size_t n = p_.repeat_last_n < 0 ? history.size() : std::min(history.size(), size_t(p_.repeat_last_n));
    std::unordered_set<int> seen(history.end() - std::ptrdiff_t(n), history.end());
    for (int id : seen) {
      if (!token_in_vocab(id, n_vocab)) continue;
      float& l = cand_[size_t(id)].first;
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    }
  }
  if (ctx.generated && (p_.presence_penalty != 0 || p_.frequency_penalty != 0))
    for (const auto& [id, count] : *ctx.generated)
      if (token_in_vocab(id, n_vocab) && count > 0)
        cand_[size_t(id)].first -= p_.frequency_penalty * float(count) + p_.presence_penalty;
  for (int32_t id : ctx.banned)
    if (token_in_vocab(id, n_vocab)) cand_[size_t(id)].first = -INFINITY;
  if (ctx.allowed) {
    const std::vector<uint64_t>& m = *ctx.allowed;
    for (int i = 0; i < n_vocab; ++i)
      if (size_t(i) / 64 >= m.size() || !(m[size_t(i) / 64] >> (i % 64) & 1)) cand_[size_t(i)].first = -INFINITY;
  }
}

namespace {
// The lowest index of the largest value(i), i < n: the greedy choice.
template <class Value>
int first_max(int n, Value value) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (value(i) > value(best)) best = i;
  return best;
}
}  // namespace

int Sampler::sample_with(const float* logits, int n_vocab, const DrawContext& ctx) {
  // Greedy with nothing to adjust: the first largest logit, read in place
  // (the same choice as below, without copying the vocabulary).
  const bool penalties = (ctx.history && p_.repeat_penalty != 1.0f && p_.repeat_last_n != 0) ||
                         (ctx.generated && (p_.presence_penalty != 0 || p_.frequency_penalty != 0));
  if (p_.temperature <= 0.f && p_.logit_bias.empty() && !penalties && ctx.banned.empty() && !ctx.allowed)
    return first_max(n_vocab, [&](int i) { return logits[i]; });
  cand_.resize(size_t(n_vocab));
  for (int i = 0; i < n_vocab; ++i) cand_[size_t(i)] = {logits[i], i};
  adjust(n_vocab, ctx);
  if (p_.temperature <= 0.f) return first_max(n_vocab, [&](int i) { return cand_[size_t(i)].first; });
  // Sort descending by logit (ties: lower id first) so every filter below is a prefix cut.
  auto by_logit = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = cand_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < keep) {
    keep = size_t(p_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  cand_.resize(keep);
  // Probabilities at temperature 1 for the top-p / min-p cuts (llama.cpp order).
  std::vector<double> prob(keep);
  const double mx = cand_[0].first;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp(double(cand_[i].first) - mx));
  for (auto& q : prob) q /= sum;
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t k = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += prob[i];
      if (cum >= p_.top_p) {
        k = i + 1;
        break;
      }
    }
    keep = k;
  }
  if (p_.min_p > 0.f) {
    const double floor_p = prob[0] * p_.min_p;
    size_t k = 1;
    while (k < keep && prob[k] >= floor_p) ++k;
    keep = k;
  }
  // Temperature, then draw.
  std::vector<double> w(keep);
  double tot = 0;
  for (size_t i = 0; i < keep; ++i) tot += (w[i] = std::exp((double(cand_[i].first) - mx) / p_.temperature));
  double u = uniform() * tot;
  for (size_t i = 0; i < keep; ++i) {
    u -= w[i];
    if (u < 0) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

}  // namespace kvs
