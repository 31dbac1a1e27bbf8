#include "tokenizer/spm.h"

#include <algorithm>
#include <stdexcept>

namespace kvs {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// A run of text in the linked list of symbols; len == 0 marks a symbol that
// was merged into its left neighbour.
struct Symbol {
  uint32_t start, len;
  int prev, next;
};

// A candidate merge of symbols[left] and symbols[right]. `size` is the byte
// length the pair had when queued, so entries made stale by an earlier merge
// of either side are recognised and skipped when popped.
struct Bigram {
  float score;
  int left, right;
  uint32_t size;
};

struct BigramOrder {
  // Max-heap order: highest score first, then leftmost.
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

// Byte length of the character a byte starts, as llama.cpp cuts SentencePiece
// input: by the high nibble alone (so 0xF8..0xFF announce four bytes, and a
// stray continuation byte one). A cut that is not a piece falls back to bytes.
size_t symbol_len(unsigned char c) {
  static constexpr uint8_t kByNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kByNibble[c >> 4];
}

std::string escape_spaces(std::string_view text, bool prefix) {
  std::string s;
  s.reserve(text.size() + text.size() / 4 + 3);
  if (prefix) s += kSpace;
  for (char c : text) {
    if (c == ' ') s += kSpace;
    else s += c;
  }
  return s;
}

std::string unescape_spaces(std::string_view piece) {
  std::string s;
  s.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpace.size(), kSpace) == 0) {
      s += ' ';
      i += kSpace.size();
    } else {
      s += piece[i++];
    }
  }
  return s;
}

}  // namespace

SpmTokenizer::SpmTokenizer(const Vocab& v) : Tokenizer(v), special_(vocab_) {
  if (vocab_.kind != VocabKind::Spm) throw std::invalid_argument("SpmTokenizer: vocab is not SentencePiece (llama)");
  if (vocab_.tokens.empty()) throw std::invalid_argument("SpmTokenizer: empty vocabulary");
  if (vocab_.scores.size() != vocab_.tokens.size())
    throw std::invalid_argument("SpmTokenizer: " + std::to_string(vocab_.scores.size()) + " scores for " +
                                std::to_string(vocab_.tokens.size()) + " tokens");
  piece_to_id_.reserve(vocab_.size());
  byte_token_.fill(-1);
  words_independent_ = true;
  bytes_.resize(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const std::string& piece = vocab_.tokens[i];
    size_t lead = 0;
    while (piece.compare(lead, kSpace.size(), kSpace) == 0) lead += kSpace.size();
    if (piece.find(kSpace, lead) != std::string::npos) words_independent_ = false;
    // Later duplicates win, as in llama.cpp's token_to_id map.
    piece_to_id_[piece] = static_cast<int>(i);
    switch (token_attr(vocab_, static_cast<int>(i))) {
      case TokenAttr::Byte: {
        const int b = parse_byte_piece(piece);
        if (b >= 0) {
          if (byte_token_[static_cast<size_t>(b)] < 0) byte_token_[static_cast<size_t>(b)] = static_cast<int>(i);
          bytes_[i] = std::string(1, static_cast<char>(b));
        }
        break;
      }
      case TokenAttr::Control:
      case TokenAttr::Unused:
        break;  // contributes no text
      case TokenAttr::Unknown:
        bytes_[i] = "\xE2\x96\x85";  // U+2585, what llama.cpp prints for <unk>
        break;
      case TokenAttr::UserDefined:
        bytes_[i] = piece;
        break;
      default:
        bytes_[i] = unescape_spaces(piece);
        break;
    }
  }
}

struct SpmTokenizer::Scratch {
  std::vector<Symbol> sym;
  std::vector<Bigram> heap;
};

void SpmTokenizer::encode_piece(std::string_view text, std::vector<int>& out) const {
  Scratch s;
  if (!words_independent_) {
    encode_word(text, out, s);
    return;
  }
  // A word starts at a U+2581 that follows something other than U+2581,
  // at a character boundary as the merges see them (symbol_len).
  size_t start = 0;
  bool prev_space = false;
  for (size_t i = 0; i < text.size();) {
    const bool space = text.compare(i, kSpace.size(), kSpace) == 0;
    if (space && !prev_space && i > 0) {
      encode_word(text.substr(start, i - start), out, s);
      start = i;
    }
    prev_space = space;
    i += std::min(symbol_len(static_cast<unsigned char>(text[i])), text.size() - i);
  }
  encode_word(text.substr(start), out, s);
}

void SpmTokenizer::encode_word(std::string_view text, std::vector<int>& out, Scratch& s) const {
  if (text.empty()) return;
  std::vector<Symbol>& sym = s.sym;
  sym.clear();
  for (size_t off = 0; off < text.size();) {
    // Invalid UTF-8 is cut by its lead byte's announced length; such a
    // "character" is not a piece and falls back to byte tokens.
    const size_t n = std::min(symbol_len(static_cast<unsigned char>(text[off])), text.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({static_cast<uint32_t>(off), static_cast<uint32_t>(n), idx - 1, idx + 1});
    off += n;
  }
  sym.back().next = -1;

  std::vector<Bigram>& heap = s.heap;
  heap.clear();
  const BigramOrder order;
  auto try_pair = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const uint32_t size = sym[l].len + sym[r].len;
    const int id = lookup(text.substr(sym[l].start, size));
    if (id < 0) return;
    heap.push_back({vocab_.scores[static_cast<size_t>(id)], l, r, size});
    std::push_heap(heap.begin(), heap.end(), order);
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_pair(i - 1, i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), order);
    const Bigram b = heap.back();
    heap.pop_back();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.size || l.next != b.right) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_pair(l.prev, b.left);
    try_pair(b.left, l.next);
  }

  for (int i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].start, sym[i].len);
    const int id = lookup(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char c : piece) {
      const int bt = byte_token_[static_cast<unsigned char>(c)];
      if (bt >= 0) {
        out.push_back(bt);
      } else if (vocab_.unk >= 0) {
        out.push_back(vocab_.unk);
      } else {
        throw std::runtime_error("SPM tokenizer: no byte token for 0x" + std::to_string(static_cast<unsigned char>(c)) +
                                 " and no unknown token");
      }
    }
  }
}

std::vector<int> SpmTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && vocab_.add_bos) {
    if (vocab_.bos < 0) throw std::runtime_error("SPM tokenizer: vocab adds BOS but has no BOS id");
    out.push_back(vocab_.bos);
  }
  // The space prefix goes on the first run of text and on every run that
  // follows a special token (SentencePiece sees each run as a new sentence).
  bool after_special = true;
  if (!text.empty()) {
    for (const Fragment& f : special_.split(text, parse_special)) {
      if (f.token >= 0) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      encode_piece(escape_spaces(f.text, vocab_.add_space_prefix && after_special), out);
      after_special = false;
    }
  }
  if (add_bos && vocab_.add_eos && vocab_.eos >= 0) out.push_back(vocab_.eos);
  return out;
}

std::string SpmTokenizer::token_bytes(int id, int prev) const {
  if (!token_in_vocab(id, n_vocab())) throw std::out_of_range("token id " + std::to_string(id) + " outside vocabulary of " +
                                                         std::to_string(n_vocab()));
  const std::string& s = bytes_[static_cast<size_t>(id)];
  // The space prefix added at encode time is not part of the text: drop it
  // right after BOS (llama2.c / llama.cpp detokenize behaviour).
  if (prev >= 0 && prev == vocab_.bos && vocab_.add_space_prefix && !s.empty() && s[0] == ' ') return s.substr(1);
  return s;
}

}  // namespace kvs
