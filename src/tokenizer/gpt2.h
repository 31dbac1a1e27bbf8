// GPT-2 style byte-level BPE: text is split by the pre-tokenizer regex, each
// pre-token's bytes are mapped to printable code points (the byte<->unicode
// table), and the pair with the lowest merge rank is merged until no ranked
// pair remains. Used by GPT-2, Qwen2, Llama 3 and most newer vocabularies.
// Text that is not valid UTF-8 is first read as llama.cpp reads it
// (lenient_utf8), so invalid bytes become U+FFFD.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

// The GPT-2 byte -> code point table: printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in byte order, so every token
// piece is printable text.
const std::array<uint32_t, 256>& gpt2_byte_to_cp();
// Inverse of the above; -1 for code points that are not in the table.
int gpt2_cp_to_byte(uint32_t cp);

class Gpt2Tokenizer final : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(const Vocab& v);
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  std::vector<int> encode(std::string_view text, bool add_bos, bool parse_special = false) const override;
  std::string token_bytes(int id, int prev) const override;

  // BPE of one pre-token (raw bytes); appends the ids to `out`.
  void encode_word(std::string_view word, std::vector<int>& out) const;
  const PreTokenizer& pretokenizer() const { return pre_; }

 private:
  struct Scratch;
  void bpe(std::string_view word, std::vector<int>& out, Scratch& s) const;
  int lookup(std::string_view piece) const {
    auto it = piece_to_id_.find(piece);
    return it == piece_to_id_.end() ? -1 : it->second;
  }
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Merge {
    int rank;    // position in tokenizer.ggml.merges: lower merges first
    int result;  // id of the concatenated piece
  };
  static uint64_t key(int a, int b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

  PreTokenizer pre_;
  SpecialSplitter special_;
  std::array<int, 256> byte_id_{};             // id of each byte's single-character piece, -1 if absent
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> merge
  std::vector<std::string> bytes_;             // decoded bytes of each token
  // Keys view vocab_.tokens, which this object owns and never changes.
  std::unordered_map<std::string_view, int, Hash, std::equal_to<>> piece_to_id_;
  // A pre-token that is itself a piece is emitted whole (the pre-type's
  // ignore_merges), even when the merges would split it differently.
  bool ignore_merges_ = false;
};

}  // namespace kvs
