#include "tokenizer/special.h"

#include <algorithm>

namespace kvs {

int parse_byte_piece(std::string_view p) {
  if (p.size() != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

TokenAttr token_attr(const Vocab& v, int id) {
  if (!v.types.empty()) return static_cast<TokenAttr>(v.types[static_cast<size_t>(id)]);
  if (id == v.bos || id == v.eos) return TokenAttr::Control;
  if (id == v.unk) return TokenAttr::Unknown;
  if (v.kind == VocabKind::Spm && parse_byte_piece(v.tokens[static_cast<size_t>(id)]) >= 0) return TokenAttr::Byte;
  return TokenAttr::Normal;
}

SpecialSplitter::SpecialSplitter(const Vocab& v) {
  for (size_t id = 0; id < v.size(); ++id) {
    const TokenAttr a = token_attr(v, static_cast<int>(id));
    if (a != TokenAttr::Control && a != TokenAttr::UserDefined && a != TokenAttr::Unknown) continue;
    if (v.tokens[id].empty()) continue;
    entries_.push_back({v.tokens[id], static_cast<int>(id), a == TokenAttr::UserDefined});
  }
  std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    const auto fa = static_cast<unsigned char>(a.text[0]), fb = static_cast<unsigned char>(b.text[0]);
    if (fa != fb) return fa < fb;
    if (a.text.size() != b.text.size()) return a.text.size() > b.text.size();
    return a.id < b.id;  // duplicate texts: the lowest id wins, deterministically
  });
  size_t e = 0;
  for (int c = 0; c < 256; ++c) {
    first_[c] = static_cast<uint32_t>(e);
    while (e < entries_.size() && static_cast<unsigned char>(entries_[e].text[0]) == c) ++e;
  }
  first_[256] = static_cast<uint32_t>(entries_.size());
}

std::vector<Fragment> SpecialSplitter::split(std::string_view text, bool parse_special) const {
  std::vector<Fragment> out;
  size_t raw_start = 0, i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const Entry* hit = nullptr;
    for (uint32_t k = first_[c]; k < first_[c + 1]; ++k) {
      const Entry& e = entries_[k];
      if (!parse_special && !e.always) continue;
      if (text.compare(i, e.text.size(), e.text) == 0) {
        hit = &e;  // longest first, so the first hit is the longest
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > raw_start) out.push_back({text.substr(raw_start, i - raw_start), -1});
    out.push_back({{}, hit->id});
    i += hit->text.size();
    raw_start = i;
  }
  if (raw_start < text.size()) out.push_back({text.substr(raw_start), -1});
  return out;
}

}  // namespace kvs
