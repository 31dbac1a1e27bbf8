// The palette-1 tile configuration, the 64 bytes LDTILECFG reads: every
// AMX kernel (matmul_amx*.cpp, flash_amx_bf16.cpp) fills one per call.
#pragma once
#include <cstdint>

namespace kvs {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace kvs
