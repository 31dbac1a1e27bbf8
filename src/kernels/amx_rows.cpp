// Per-type AMX thresholds: a table of atomics, read lock-free by the kernels
// on any pool thread while the CLI or a test sets it.
#include "kernels/amx_rows.h"

#include <atomic>

#include "kernels/cpu.h"
#include <stdexcept>
#include <string>

namespace kvs {
namespace {

constexpr int kTypes = 64;            // above every GgmlType value
std::atomic<int> g_rows[kTypes];      // 0 = the default

int slot(GgmlType t) {
  const int i = int(t);
  if (i < 0 || i >= kTypes) throw std::invalid_argument("amx rows: type out of range");
  return i;
}

}  // namespace

bool amx_tile_type(GgmlType t) {
  return t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q4_K || t == GgmlType::Q5_K ||
         t == GgmlType::Q6_K || t == GgmlType::MXFP4;
}

int default_amx_min_rows(GgmlType t) {
  // Where `kvserve probe` found tiles ahead on an Intel Xeon with AMX, the
  // weights streamed from DRAM (docs/PERFORMANCE.md, "AMX"); a machine's
  // own probe replaces them.
  switch (t) {
    case GgmlType::Q8_0: return 4;
    case GgmlType::Q4_0: return 4;
    case GgmlType::MXFP4: return 4;  // Q4_0's: the same kernels on the same levels after the lookup
    case GgmlType::Q4_K: return 4;
    case GgmlType::Q5_K: return 4;  // Q4_K's: the same kernels with a fifth level bit
    case GgmlType::Q6_K: return 12;
    default: return kAmxNever;
  }
}

int amx_min_rows(GgmlType t) {
  const int v = g_rows[slot(t)].load(std::memory_order_relaxed);
  return v == 0 ? default_amx_min_rows(t) : v;
}

void set_amx_min_rows(GgmlType t, int n) {
  if (!amx_tile_type(t)) throw std::invalid_argument("amx rows: " + type_name(t) + " has no AMX kernels");
  if (n < 1 || n > kAmxNever) throw std::invalid_argument("amx rows: n must be in [1, 2^30]");
  g_rows[slot(t)].store(n, std::memory_order_relaxed);
}

void reset_amx_min_rows() {
  for (auto& r : g_rows) r.store(0, std::memory_order_relaxed);
}

bool amx_tiles_apply(const WeightView& w, int64_t n) {
  return w.pack == PackLayout::Panel16 && amx_tile_type(w.type) && n >= amx_min_rows(w.type);
}

bool amx_tiles_run(const WeightView& w, int64_t n) { return active_isa() == Isa::Amx && amx_tiles_apply(w, n); }

}  // namespace kvs
