#include "tokenizer/gpt2.h"

#include <algorithm>
#include <stdexcept>

#include "tokenizer/utf8.h"

namespace kvs {

const std::array<uint32_t, 256>& gpt2_byte_to_cp() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

int gpt2_cp_to_byte(uint32_t cp) {
  static const std::array<int16_t, 512> inv = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    const auto& fwd = gpt2_byte_to_cp();
    for (int b = 0; b < 256; ++b) t[fwd[static_cast<size_t>(b)]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < inv.size() ? inv[cp] : -1;
}

namespace {

// Piece text -> raw bytes through the inverse table. Code points outside the
// table (only in odd vocabularies) are kept as their UTF-8.
std::string unmap_piece(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    const utf8::Decoded d = utf8::decode(piece.substr(i));
    if (d.status == utf8::Status::Valid) {
      const int b = gpt2_cp_to_byte(d.cp);
      if (b >= 0) out += static_cast<char>(b);
      else out.append(piece.data() + i, d.len);
    } else {
      out.append(piece.data() + i, d.len);
    }
    i += d.len;
  }
  return out;
}

const PreType& pre_type_of(const Vocab& v) {
  const PreType* t = find_pre_type(v.pre);
  if (!t)
    throw std::invalid_argument("Gpt2Tokenizer: unknown pre-tokenizer '" + v.pre + "' (known: " + known_pre_types() + ")");
  return *t;
}

}  // namespace

struct Gpt2Tokenizer::Scratch {
  struct Cand {
    int rank, left, a, b, result;  // merge rank; left symbol; ids expected on both sides; merged id
  };
  std::vector<int> ids, prev, next;
  std::vector<Cand> heap;
};

Gpt2Tokenizer::Gpt2Tokenizer(const Vocab& v) : Tokenizer(v), pre_(pre_type_of(vocab_)), special_(vocab_) {
  if (vocab_.kind != VocabKind::Gpt2) throw std::invalid_argument("Gpt2Tokenizer: vocab is not byte-level BPE (gpt2)");
  if (vocab_.tokens.empty()) throw std::invalid_argument("Gpt2Tokenizer: empty vocabulary");
  ignore_merges_ = pre_.type().ignore_merges;

  piece_to_id_.reserve(vocab_.size());
  bytes_.resize(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const std::string& piece = vocab_.tokens[i];
    piece_to_id_[piece] = static_cast<int>(i);  // later duplicates win, as in llama.cpp
    switch (token_attr(vocab_, static_cast<int>(i))) {
      case TokenAttr::Control:
      case TokenAttr::Unused:
      case TokenAttr::Unknown:
        break;  // no text
      case TokenAttr::UserDefined:
        bytes_[i] = piece;  // added tokens are stored as plain text, not byte-mapped
        break;
      case TokenAttr::Byte: {
        const int b = parse_byte_piece(piece);
        bytes_[i] = b >= 0 ? std::string(1, static_cast<char>(b)) : unmap_piece(piece);
        break;
      }
      default:
        bytes_[i] = unmap_piece(piece);
        break;
    }
  }

  const auto& b2cp = gpt2_byte_to_cp();
  for (size_t b = 0; b < 256; ++b) byte_id_[b] = lookup(utf8::encode(b2cp[b]));

  merges_.reserve(vocab_.merges.size());
  std::string joined;
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    const std::string& m = vocab_.merges[r];
    // Search from 1: a piece never is empty, so the separator is not at 0.
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos || sp + 1 >= m.size())
      throw std::invalid_argument("Gpt2Tokenizer: merge " + std::to_string(r) + " '" + m + "' is not \"left right\"");
    const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
    const int a = lookup(left), b = lookup(right);
    joined.assign(left);
    joined.append(right);
    const int c = lookup(joined);
    // A merge whose parts or result are not pieces can never be applied to
    // ids; skipping it loses nothing that could be emitted.
    if (a < 0 || b < 0 || c < 0) continue;
    merges_.emplace(key(a, b), Merge{static_cast<int>(r), c});  // first (lowest rank) wins
  }
}

void Gpt2Tokenizer::bpe(std::string_view word, std::vector<int>& out, Scratch& s) const {
  const size_t n = word.size();
  if (n == 0) return;
  if (ignore_merges_ && n > 1) {
    std::string mapped;
    const auto& b2cp = gpt2_byte_to_cp();
    for (char c : word) utf8::append(mapped, b2cp[static_cast<unsigned char>(c)]);
    const int id = lookup(mapped);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  s.ids.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const int id = byte_id_[static_cast<unsigned char>(word[i])];
    if (id < 0) {
      if (vocab_.unk < 0)
        throw std::runtime_error("BPE tokenizer: byte 0x" + std::to_string(static_cast<unsigned char>(word[i])) +
                                 " has no token and the vocabulary has no unknown token");
    }
    s.ids[i] = id < 0 ? vocab_.unk : id;
  }
  if (n == 1) {
    out.push_back(s.ids[0]);
    return;
  }
  s.prev.resize(n);
  s.next.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.prev[i] = static_cast<int>(i) - 1;
    s.next[i] = i + 1 < n ? static_cast<int>(i) + 1 : -1;
  }
  // Min-heap on (rank, left position): the lowest rank merges first and,
  // among equal pairs, the leftmost one.
  auto later = [](const Scratch::Cand& x, const Scratch::Cand& y) {
    return x.rank > y.rank || (x.rank == y.rank && x.left > y.left);
  };
  s.heap.clear();
  auto consider = [&](int l, int r) {
    auto it = merges_.find(key(s.ids[static_cast<size_t>(l)], s.ids[static_cast<size_t>(r)]));
    if (it == merges_.end()) return;
    s.heap.push_back({it->second.rank, l, s.ids[static_cast<size_t>(l)], s.ids[static_cast<size_t>(r)], it->second.result});
    std::push_heap(s.heap.begin(), s.heap.end(), later);
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int>(i), static_cast<int>(i) + 1);

  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), later);
    const Scratch::Cand c = s.heap.back();
    s.heap.pop_back();
    // Stale if either side has changed since the candidate was queued (a
    // merged-away symbol has id -1, a merged symbol a new id).
    const int l = c.left;
    if (s.ids[static_cast<size_t>(l)] != c.a) continue;
    const int r = s.next[static_cast<size_t>(l)];
    if (r < 0 || s.ids[static_cast<size_t>(r)] != c.b) continue;
    s.ids[static_cast<size_t>(l)] = c.result;
    s.ids[static_cast<size_t>(r)] = -1;
    const int rn = s.next[static_cast<size_t>(r)];
    s.next[static_cast<size_t>(l)] = rn;
    if (rn >= 0) s.prev[static_cast<size_t>(rn)] = l;
    if (s.prev[static_cast<size_t>(l)] >= 0) consider(s.prev[static_cast<size_t>(l)], l);
    if (rn >= 0) consider(l, rn);
  }
  for (int i = 0; i >= 0; i = s.next[static_cast<size_t>(i)]) out.push_back(s.ids[static_cast<size_t>(i)]);
}

void Gpt2Tokenizer::encode_word(std::string_view word, std::vector<int>& out) const {
  Scratch s;
  bpe(word, out, s);
}

std::vector<int> Gpt2Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && vocab_.add_bos) {
    if (vocab_.bos < 0) throw std::runtime_error("BPE tokenizer: vocab adds BOS but has no BOS id");
    out.push_back(vocab_.bos);
  }
  Scratch s;
  auto emit = [&](std::string_view word) { bpe(word, out, s); };
  for (const Fragment& f : special_.split(text, parse_special)) {
    if (f.token >= 0) out.push_back(f.token);
    else pre_.split(f.text, emit);
  }
  if (add_bos && vocab_.add_eos && vocab_.eos >= 0) out.push_back(vocab_.eos);
  return out;
}

std::string Gpt2Tokenizer::token_bytes(int id, int prev) const {
  if (!token_in_vocab(id, n_vocab()))
    throw std::out_of_range("token id " + std::to_string(id) + " outside vocabulary of " + std::to_string(n_vocab()));
  return bytes_[static_cast<size_t>(id)];
}

}  // namespace kvs
