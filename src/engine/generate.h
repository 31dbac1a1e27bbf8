// Single-request text generation on a LocalSequence: prompt -> prefill ->
// decode loop with sampling, stop strings, EOS and max-tokens handling,
// streaming complete UTF-8 text to a callback.
#pragma once
#include <functional>
#include <string>
#include <vector>
#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "kv/window_policy.h"
#include "kvserve/engine.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

struct GenerateParams {
  SamplingParams sampling;
  int max_tokens = 128;
  std::vector<std::string> stop;  // stop strings (not included in the text)
  bool ignore_eos = false;
  int n_ctx = 0;                  // 0 = model's training context
  KvCacheOptions cache;           // --kv-type and friends
  // A bounding window (or the model's native one) lifts the n_ctx limit:
  // prompt and generation may run past it at constant KV memory.
  WindowPolicy window;
};

struct GenerateResult {
  std::vector<int> prompt_tokens;  // ids fed to the model, BOS included
  std::vector<int> tokens;         // generated ids, without the EOS/BOS that ended it
  std::string text;                // generated text (stop string removed)
  std::string finish_reason;       // "stop" (EOS / stop string) or "length"
  double prefill_seconds = 0, decode_seconds = 0;
  int decode_steps = 0;
};

// True when `id` ends generation: EOS / end-of-turn tokens, and a generated
// BOS (a new document starting: the llama2.c convention, applied to all models).
bool ends_generation(const Tokenizer& tok, int id);

// on_text(piece) receives text as it becomes final; return false to stop.
GenerateResult generate(Engine& engine, const Tokenizer& tok, const std::vector<int>& prompt_tokens,
                        const GenerateParams& p,
                        const std::function<bool(const std::string&)>& on_text = nullptr);

// Holds back text that might be the start of a stop string; reports a match.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends text; returns the part that is safe to emit now. Sets `stopped`
  // when a stop string appeared (everything from it on is dropped).
  std::string push(const std::string& text, bool& stopped);
  std::string flush();  // held-back text when generation ends without a stop

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace kvs
