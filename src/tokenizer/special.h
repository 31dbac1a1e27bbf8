// Splits text around special-token texts ("<s>", "<|im_start|>", ...) before
// the regular tokenizer runs, as llama.cpp partitions it: the special texts
// in order of length, longest first, each splitting every run of text the
// longer ones left wherever it occurs (leftmost first, no overlaps).
// User-defined tokens are always split out (Hugging Face does so even without
// special parsing); control and unknown tokens only when the caller asks to
// parse special text, so user text like "</s>" is otherwise tokenized
// literally. A token with a strip mark (Vocab::strip) also drops the white
// space beside it on that side.
#pragma once
#include <array>
#include <string>
#include <string_view>
#include <vector>
#include "tokenizer/vocab.h"

namespace kvs {

// Attribute of token `id`, derived when the vocab has no token_type array
// (llama2.c): bos/eos are control, unk is unknown, "<0xNN>" pieces are bytes.
TokenAttr token_attr(const Vocab& v, int id);

// "<0xNN>" -> NN, else -1.
int parse_byte_piece(std::string_view piece);

struct Fragment {
  std::string_view text;  // raw text when token < 0
  int token = -1;         // a special token id
};

class SpecialSplitter {
 public:
  explicit SpecialSplitter(const Vocab& v);
  // The views in the result point into `text`.
  std::vector<Fragment> split(std::string_view text, bool parse_special) const;
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::string text;
    int id;
    bool always;   // user-defined: split even without parse_special
    uint8_t strip;  // kStripLeft | kStripRight
  };
  // Which entries occur in `text` at all, in the order they split it.
  std::vector<uint32_t> present(std::string_view text, bool parse_special) const;
  std::vector<Entry> entries_;  // sorted by first byte, then length descending
  // First-byte index into entries_: [begin, end) per byte value, so a scan
  // only tries the few candidates that can start at each position.
  std::array<uint32_t, 257> first_{};
};

}  // namespace kvs
