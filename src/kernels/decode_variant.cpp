// Per-type decode variant choice: a small table of atomics, so a kernel on
// any pool thread reads it without a lock while the CLI or a test sets it.
#include "kernels/decode_variant.h"

#include <atomic>
#include <stdexcept>

namespace kvs {
namespace {

constexpr int kTypes = 64;  // above every GgmlType value

// 0 = the default (panels is never 0 in a candidate).
uint32_t encode(const DecodeVariant& v) { return uint32_t(v.panels) | uint32_t(v.prefetch) << 8; }
DecodeVariant decode(uint32_t e) { return e == 0 ? DecodeVariant{} : DecodeVariant{int(e & 0xFF), int(e >> 8)}; }

std::atomic<uint32_t> g_table[kTypes];  // zero-initialised: every type at the default

std::atomic<uint32_t>* table() { return g_table; }

int slot(GgmlType t) {
  const int i = int(t);
  if (i < 0 || i >= kTypes) throw std::invalid_argument("decode variant: type out of range");
  return i;
}

}  // namespace

const std::vector<DecodeVariant>& decode_variants() {
  static const std::vector<DecodeVariant> v = [] {
    std::vector<DecodeVariant> out{DecodeVariant{}};
    for (int panels : {1, 2, 4})
      for (int prefetch : {0, 512, 1024, 2048})
        if (!(DecodeVariant{panels, prefetch} == out[0])) out.push_back({panels, prefetch});
    return out;
  }();
  return v;
}

bool decode_variants_apply(GgmlType t, PackLayout layout) {
  if (layout == PackLayout::None) return false;
  const bool flt = t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
  return !flt || layout == PackLayout::Panel8;
}

bool is_decode_variant(const DecodeVariant& v) {
  for (const DecodeVariant& c : decode_variants())
    if (c == v) return true;
  return false;
}

DecodeVariant decode_variant(GgmlType t) { return decode(table()[slot(t)].load(std::memory_order_relaxed)); }

void set_decode_variant(GgmlType t, const DecodeVariant& v) {
  if (!is_decode_variant(v)) throw std::invalid_argument("decode variant " + to_string(v) + " is not a candidate");
  table()[slot(t)].store(encode(v), std::memory_order_relaxed);
}

void reset_decode_variants() {
  for (int i = 0; i < kTypes; ++i) table()[i].store(0, std::memory_order_relaxed);
}

std::string to_string(const DecodeVariant& v) {
  return "panels=" + std::to_string(v.panels) + " prefetch=" + std::to_string(v.prefetch);
}

}  // namespace kvs
