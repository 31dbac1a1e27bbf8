#include "tokenizer/unicode_class.h"

#include <array>
#include <memory>

namespace kvs {

namespace {

constexpr uint32_t kCodePoints = 0x110000;

// One byte per code point (about 1 MiB), filled once from the ranges: the
// pre-tokenizer looks up every character of every prompt.
const uint8_t* class_table() {
  static const std::unique_ptr<uint8_t[]> table = [] {
    auto t = std::make_unique<uint8_t[]>(kCodePoints);
    for (size_t i = 0; i < unicode_data::kClassRangeCount; ++i) {
      const uint32_t first = unicode_data::kClassRanges[i] >> 3;
      const uint32_t end = i + 1 < unicode_data::kClassRangeCount ? unicode_data::kClassRanges[i + 1] >> 3 : kCodePoints;
      const auto c = static_cast<uint8_t>(unicode_data::kClassRanges[i] & 7);
      for (uint32_t cp = first; cp < end; ++cp) t[cp] = c;
    }
    return t;
  }();
  return table.get();
}

}  // namespace

CharClass char_class(uint32_t cp) {
  return cp < kCodePoints ? static_cast<CharClass>(class_table()[cp]) : CharClass::Other;
}

}  // namespace kvs
