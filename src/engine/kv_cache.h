// The KV cache's element type and quantization as the user picks them
// (--kv-type, --kv-key-scale, --kv-residual, --kv-group), turned into the
// storage layout of one model.
#pragma once
#include "kernels/kv_layout.h"

namespace kvs {

class Engine;

struct KvCacheOptions {
  KvType type = KvType::F32;
  KeyScale key_scale = KeyScale::Channel;
  int residual = 0;         // tokens per key group = full-precision residual; 0 = the block size
  int group_channels = 32;  // row elements per (scale, min) in per-token quantization
  // The hybrid cache (kernels/kv_groups.h): layers grouped by window, each
  // group's tables keeping only its window. false: one table of every layer
  // at full size (what the hybrid cache is measured and tested against).
  bool hybrid = true;
};

// The layout of `engine`'s model with these options (layer groups from the
// model's per-layer windows unless cache.hybrid is false); throws
// std::invalid_argument with the broken rule (KvLayout::validate).
KvLayout kv_layout_for(const Engine& engine, int block_size, const KvCacheOptions& cache);

}  // namespace kvs
