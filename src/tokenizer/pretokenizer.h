// Regex pre-tokenizer of byte-level BPE vocabularies: splits text into the
// "words" that BPE merges never cross. The pattern is chosen by the GGUF key
// tokenizer.ggml.pre and run with PCRE2 (UTF + Unicode properties, JIT when
// available). The compiled pattern is shared read-only; every call uses its
// own match data, so one PreTokenizer serves many threads.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace kvs {

// The regex that tokenizer.ggml.pre `name` stands for. Known: "gpt2"/"gpt-2"/
// "default"/"" (GPT-2), "llama3"/"llama-bpe"/"llama-v3" (Llama 3), "qwen2".
// `known` (optional) tells whether the name was recognised; unknown names
// get the GPT-2 pattern.
std::string pretokenizer_pattern(const std::string& name, bool* known = nullptr);

class PreTokenizer {
 public:
  // Unknown names fall back to the GPT-2 rule with one warning on stderr
  // (once per name per process). Throws std::runtime_error if PCRE2 rejects
  // the pattern.
  explicit PreTokenizer(const std::string& name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Calls `emit` for each pre-token in order; together they cover `text`
  // exactly. Bytes that are not valid UTF-8 never match the pattern and are
  // emitted as pre-tokens of their own.
  void split(std::string_view text, const std::function<void(std::string_view)>& emit) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8* (kept out of the header)
};

}  // namespace kvs
