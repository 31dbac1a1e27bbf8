#include "tokenizer/utf8.h"

namespace kvs::utf8 {

Decoded decode(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return {Status::Valid, b0, 1};
  size_t need;
  uint32_t cp;
  // Allowed range of the second byte depends on the lead byte; this is how
  // overlong forms, surrogates and > U+10FFFF are rejected at the earliest byte.
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Status::Invalid, 0, 1};  // stray continuation byte, C0/C1, F5..FF
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= s.size()) return {Status::Incomplete, 0, i};
    const auto b = static_cast<unsigned char>(s[i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Status::Invalid, 0, i};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Status::Valid, cp, need};
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string encode(uint32_t cp) {
  std::string s;
  append(s, cp);
  return s;
}

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const Decoded d = decode(s.substr(i));
    if (d.status == Status::Valid) {
      out.append(s.data() + i, d.len);
    } else {
      out += kReplacement;
    }
    i += d.len;
  }
  return out;
}

size_t complete_prefix(std::string_view s) {
  // Only the last (up to) 3 bytes can be an unfinished character; everything
  // before them is complete one way or another.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  // Step back to a position that is not a continuation byte so decoding
  // starts on a lead byte (or on a stray byte, which is then "complete").
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t i = start;
  while (i < s.size()) {
    const Decoded d = decode(s.substr(i));
    if (d.status == Status::Incomplete) return i;
    i += d.len;
  }
  return s.size();
}

}  // namespace kvs::utf8
