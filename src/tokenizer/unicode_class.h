// The character classes the byte-level BPE pre-tokenizers test (\p{L},
// \p{N}, \p{P}, \p{S}, \p{M}, \s), from kvserve's own table of Unicode 15.1
// (scripts/gen_unicode_classes.py), the version llama.cpp's tables follow.
// PCRE2's built-in properties follow the system library's Unicode version
// instead, so the pre-tokenizer matches on these classes, not on PCRE2's.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvs {

// White space wins over the general category (U+00A0 is Space, not Other).
// Other: controls, format characters, private use, surrogates, unassigned.
enum class CharClass : uint8_t { Other, Letter, Number, Punct, Symbol, Mark, Space };

// Any value; code points above U+10FFFF are Other.
CharClass char_class(uint32_t cp);

namespace unicode_data {
extern const uint32_t kClassRanges[];  // (first code point << 3) | class, ascending
extern const size_t kClassRangeCount;
}  // namespace unicode_data

}  // namespace kvs
