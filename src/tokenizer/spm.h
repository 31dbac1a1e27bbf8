// SentencePiece-style BPE as llama.cpp and llama2.c run it on a Llama vocab:
// spaces become U+2581, a leading U+2581 is added (add_space_prefix), the text
// is split into UTF-8 characters and the adjacent pair whose concatenation is
// the vocabulary piece with the highest score is merged until none is left.
// Characters that never became a piece fall back to <0xNN> byte tokens.
#pragma once
#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>
#include "tokenizer/special.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(const Vocab& v);
  SpmTokenizer(const SpmTokenizer&) = delete;
  SpmTokenizer& operator=(const SpmTokenizer&) = delete;

  std::vector<int> encode(std::string_view text, bool add_bos, bool parse_special = false) const override;
  std::string token_bytes(int id, int prev) const override;

  // Tokenizes one run of ordinary text (no special tokens, no prefix rule):
  // `text` is already space-escaped. Appends to `out`.
  void encode_piece(std::string_view escaped, std::vector<int>& out) const;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Keys view vocab_.tokens, which this object owns and never changes.
  std::unordered_map<std::string_view, int, Hash, std::equal_to<>> piece_to_id_;
  std::array<int, 256> byte_token_{};  // byte -> <0xNN> id, or -1
  std::vector<std::string> bytes_;     // decoded text per id (before the BOS rule)
  SpecialSplitter special_;
  // True when no piece has U+2581 after a non-space character (true for the
  // Llama vocabularies): then no merge can cross the start of a word, and
  // each word is tokenized on its own, with small, cache-resident queues.
  bool words_independent_ = false;

  struct Scratch;
  void encode_word(std::string_view text, std::vector<int>& out, Scratch& s) const;

  int lookup(std::string_view piece) const {
    auto it = piece_to_id_.find(piece);
    return it == piece_to_id_.end() ? -1 : it->second;
  }
};

}  // namespace kvs
