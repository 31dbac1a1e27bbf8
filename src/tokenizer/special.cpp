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
    const uint8_t strip = id < v.strip.size() ? v.strip[id] : 0;
    entries_.push_back({v.tokens[id], static_cast<int>(id), a == TokenAttr::UserDefined, strip});
  }
  std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    const auto fa = static_cast<unsigned char>(a.text[0]), fb = static_cast<unsigned char>(b.text[0]);
    if (fa != fb) return fa < fb;
    if (a.text.size() != b.text.size()) return a.text.size() > b.text.size();
    return a.id < b.id;
  });
  size_t e = 0;
  for (int c = 0; c < 256; ++c) {
    first_[c] = static_cast<uint32_t>(e);
    while (e < entries_.size() && static_cast<unsigned char>(entries_[e].text[0]) == c) ++e;
  }
  first_[256] = static_cast<uint32_t>(entries_.size());
}

std::vector<uint32_t> SpecialSplitter::present(std::string_view text, bool parse_special) const {
  std::vector<uint32_t> found;
  if (entries_.empty()) return found;
  std::vector<char> seen(entries_.size(), 0);
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    for (uint32_t k = first_[c]; k < first_[c + 1]; ++k) {
      const Entry& e = entries_[k];
      if (seen[k] || (!parse_special && !e.always)) continue;
      if (text.compare(i, e.text.size(), e.text) == 0) {
        seen[k] = 1;
        found.push_back(k);
      }
    }
  }
  // Longest first; equal lengths by id (llama.cpp leaves their order open).
  std::sort(found.begin(), found.end(), [&](uint32_t a, uint32_t b) {
    const Entry &x = entries_[a], &y = entries_[b];
    return x.text.size() != y.text.size() ? x.text.size() > y.text.size() : x.id < y.id;
  });
  return found;
}

std::vector<Fragment> SpecialSplitter::split(std::string_view text, bool parse_special) const {
  struct Part {
    size_t off, len;
    int token;
  };
  // C isspace, as llama.cpp strips.
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  std::vector<Part> parts, next;
  if (!text.empty()) parts.push_back({0, text.size(), -1});
  for (uint32_t k : present(text, parse_special)) {
    const Entry& e = entries_[k];
    next.clear();
    for (const Part& p : parts) {
      if (p.token >= 0) {
        next.push_back(p);
        continue;
      }
      size_t base = p.off, end = p.off + p.len;
      for (;;) {
        const size_t at = text.substr(0, end).find(e.text, base);
        if (at == std::string_view::npos) {
          if (end > base) next.push_back({base, end - base, -1});
          break;
        }
        size_t left_end = at;
        if (e.strip & kStripLeft)
          while (left_end > base && space(text[left_end - 1])) --left_end;
        if (left_end > base) next.push_back({base, left_end - base, -1});
        next.push_back({0, 0, e.id});
        base = at + e.text.size();
        if (e.strip & kStripRight)
          while (base < end && space(text[base])) ++base;
      }
    }
    parts.swap(next);
  }
  std::vector<Fragment> out;
  out.reserve(parts.size());
  for (const Part& p : parts) out.push_back(p.token >= 0 ? Fragment{{}, p.token} : Fragment{text.substr(p.off, p.len), -1});
  return out;
}

}  // namespace kvs
