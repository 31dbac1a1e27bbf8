#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "engine/local_sequence.h"
#include "model/model.h"

namespace kvs {

bool ends_generation(const Tokenizer& tok, int id) {
  return tok.is_eog(id) || id == tok.vocab().bos;
}

std::string StopMatcher::push(const std::string& text, bool& stopped) {
  held_ += text;
  stopped = false;
  size_t cut = std::string::npos;
  for (const auto& s : stops_) {
    if (s.empty()) continue;
    size_t at = held_.find(s);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    stopped = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Keep the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

GenerateResult generate(Engine& engine, const Tokenizer& tok, const std::vector<int>& prompt_tokens,
                        const GenerateParams& p, const std::function<bool(const std::string&)>& on_text) {
  using clock = std::chrono::steady_clock;
  GenerateResult r;
  r.prompt_tokens = prompt_tokens;
  if (prompt_tokens.empty()) throw std::invalid_argument("empty prompt: nothing to condition on");
  const bool bounded = p.window.resolve(engine.model().config().sliding_window).max_visible() > 0;
  const int n_ctx = bounded ? (1 << 30) : p.n_ctx > 0 ? p.n_ctx : engine.model().config().n_ctx_train;
  if (int(prompt_tokens.size()) >= n_ctx)
    throw std::length_error("prompt has " + std::to_string(prompt_tokens.size()) +
                            " tokens; the context holds " + std::to_string(n_ctx) + " (raise --ctx)");
  const int n_vocab = engine.model().config().n_vocab;
  LocalSequence seq(engine, n_ctx, 16, p.cache, p.window);
  Sampler sampler(p.sampling);
  Detokenizer detok(tok);
  StopMatcher stop(p.stop);
  std::vector<int> history(prompt_tokens.begin(), prompt_tokens.end());
  bool go_on = true;
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    r.text += s;
    if (on_text && !on_text(s)) go_on = false;
  };

  auto t0 = clock::now();
  std::vector<int32_t> pt(prompt_tokens.begin(), prompt_tokens.end());
  std::vector<float> logits = seq.eval(pt);
  auto t1 = clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.finish_reason = "length";
  bool stop_string_hit = false;
  for (int i = 0; i < p.max_tokens && go_on; ++i) {
    const int id = sampler.sample(logits.data(), n_vocab, history);
    if (!p.ignore_eos && ends_generation(tok, id)) {
      r.finish_reason = "stop";
      break;
    }
    r.tokens.push_back(id);
    history.push_back(id);
    bool stopped = false;
    emit(stop.push(detok.push(id), stopped));
    if (stopped) {
      r.finish_reason = "stop";
      stop_string_hit = true;
      break;
    }
    if (i + 1 == p.max_tokens) break;
    if (seq.n_past() >= n_ctx) break;  // context full: "length"
    const int32_t t = id;
    logits = seq.eval(&t, 1);
    ++r.decode_steps;
  }
  if (!stop_string_hit) {  // release text held for UTF-8 completion or stop prefixes
    bool stopped = false;
    emit(stop.push(detok.flush(), stopped));
    if (!stopped) emit(stop.flush());
  }
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

}  // namespace kvs
