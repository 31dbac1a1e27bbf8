// Vocabulary data as stored in a model file, independent of the algorithm
// that uses it. Filled by the GGUF loader (tokenizer.ggml.*) or the llama2.c
// tokenizer reader.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvs {

enum class VocabKind { None, Spm, Gpt2 };  // tokenizer.ggml.model: "llama" / "gpt2"

// llama.cpp token types (tokenizer.ggml.token_type)
enum class TokenAttr : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// Vocab::strip bits: when text is split around a special token, the white
// space next to it on that side is dropped (llama.cpp's LSTRIP / RSTRIP).
inline constexpr uint8_t kStripLeft = 1, kStripRight = 2;

struct Vocab {
  VocabKind kind = VocabKind::None;
  std::string pre;                      // tokenizer.ggml.pre (gpt2: a name pre_type.h knows; "" = "default")
  std::vector<std::string> tokens;      // id -> piece (SPM: with U+2581 for space; GPT-2: byte-mapped unicode)
  std::vector<float> scores;            // SPM merge scores (may be empty for gpt2)
  std::vector<int32_t> types;           // TokenAttr per id (may be empty => Normal)
  std::vector<std::string> merges;      // GPT-2: "a b" in rank order
  std::vector<uint8_t> strip;           // kStripLeft | kStripRight per id (may be empty => none)
  int bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = true;         // SPM leading-space rule
  std::string chat_template;            // tokenizer.chat_template, if any
  // Named variants, tokenizer.chat_template.<name> (e.g. "tool_use"), in key order.
  std::vector<std::pair<std::string, std::string>> chat_template_variants;
  bool llama2c = false;                 // llama2.c convention: generated BOS ends the text
  size_t size() const { return tokens.size(); }
};

// The one token-id range rule, shared by the engine, the scheduler and the
// server so that what one accepts the others never reject.
inline bool token_in_vocab(int64_t id, int64_t n_vocab) { return id >= 0 && id < n_vocab; }
// Index of the first id outside [0, n_vocab), or -1 when all are inside.
inline int64_t first_token_outside_vocab(std::span<const int32_t> ids, int64_t n_vocab) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (!token_in_vocab(ids[i], n_vocab)) return int64_t(i);
  return -1;
}
// The rule's one message: "" when every id is inside, else which id, where,
// and the vocabulary's size. `what` names the ids ("prompt", "token").
inline std::string token_ids_error(std::span<const int32_t> ids, int64_t n_vocab, const std::string& what) {
  const int64_t bad = first_token_outside_vocab(ids, n_vocab);
  if (bad < 0) return {};
  return what + " token id " + std::to_string(ids[size_t(bad)]) + (ids.size() > 1 ? " at position " + std::to_string(bad) : "") +
         " is outside the vocabulary of " + std::to_string(n_vocab) + " tokens";
}

}  // namespace kvs
