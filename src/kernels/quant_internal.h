// Internal to src/kernels: helpers shared by the dequantizers (quant.cpp)
// and the reference quantizers (quantize_ref.cpp).
#pragma once
#include <cstdint>

#include "kernels/quant.h"

namespace kvs::detail {

// ---- K-quant scale packing -------------------------------------------------
// 8 sub-blocks each have a 6-bit scale and 6-bit min packed into 12 bytes:
// bytes 0..3 low 6 bits of scales 0..3 (top 2 bits carry scale 4..7 high
// bits), bytes 4..7 likewise for mins, bytes 8..11 low nibbles of scales /
// mins 4..7.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// Throws std::invalid_argument unless n >= 0 is a whole number of t's blocks.
void check_blocks(GgmlType t, int64_t n, const char* what);

}  // namespace kvs::detail
