// UTF-8 helpers shared by the tokenizers and the streaming detokenizer.
// Everything here is strict (RFC 3629): overlong forms, surrogates and code
// points above U+10FFFF are invalid, so text we emit is always valid UTF-8.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvs::utf8 {

enum class Status { Valid, Incomplete, Invalid };

struct Decoded {
  Status status;
  uint32_t cp;  // the code point when Valid
  size_t len;   // Valid: bytes of the character; Incomplete: bytes present (all
                // a valid prefix); Invalid: bytes to drop as one bad sequence (>= 1)
};

// Decodes the character starting at s[0] (s must be non-empty). Invalid
// sequences report the length of their "maximal subpart" (Unicode 3.9 / WHATWG),
// which is what gets replaced by one U+FFFD.
Decoded decode(std::string_view s);

void append(std::string& out, uint32_t cp);  // cp must be <= 0x10FFFF
std::string encode(uint32_t cp);

// Copies `s` with every invalid sequence (including a truncated tail) replaced
// by U+FFFD.
std::string sanitize(std::string_view s);

// Length of the longest prefix of `s` that ends on a character boundary,
// treating a trailing valid-but-incomplete sequence as "not yet complete".
// Invalid bytes in the middle count as complete (they will be replaced).
size_t complete_prefix(std::string_view s);

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace kvs::utf8
