// Random quantized weight matrices for the matmul tests: normal values
// with a different magnitude per 32-element block, so the block scales
// matter; optionally with the Panel16 copy Model::load makes on AVX-512
// (made here on any CPU).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/weight_pack.h"

namespace kvs::test {

struct QuantWeights {
  std::vector<uint8_t> bytes;  // [rows, row_bytes]
  WeightView view;
  PackedArena arena;
};

inline QuantWeights quant_weights(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.2f, 3.0f);
  QuantWeights w;
  const size_t rb = row_bytes(t, cols);
  w.bytes.assign(size_t(rows) * rb, 0);
  std::vector<float> src(static_cast<size_t>(cols));  // [cols]
  for (int64_t r = 0; r < rows; ++r) {
    float m = 1.0f;
    for (int64_t c = 0; c < cols; ++c) {
      if (c % 32 == 0) m = mag(rng);
      src[size_t(c)] = nd(rng) * m;
    }
    quantize_row(t, src.data(), w.bytes.data() + size_t(r) * rb, cols);
  }
  w.view = WeightView{t, w.bytes.data(), rows, cols, rb};
  return w;
}

inline QuantWeights panel16_weights(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  QuantWeights w = quant_weights(t, rows, cols, seed);
  w.arena = PackedArena(packed_size(w.view, PackLayout::Panel16));
  pack_panels_into(w.view, PackLayout::Panel16, w.arena.data());
  w.view.packed = w.arena.data();
  w.view.pack = PackLayout::Panel16;
  return w;
}

}  // namespace kvs::test
