// Where K and V live. All KV memory is cut into blocks of `block_size` token
// slots; a block holds K and V of every layer for its slots:
//   block b, layer l: K [block_size, n_kv_heads, head_dim], then V (same shape)
// A sequence's K/V are addressed through its block table (logical block i ->
// physical block id), so attention never needs a contiguous copy.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvs {

struct KvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  size_t row_floats() const { return size_t(n_kv_heads) * head_dim; }          // one token, one layer, K or V
  size_t layer_floats() const { return 2 * size_t(block_size) * row_floats(); }  // K and V of one layer
  size_t block_floats() const { return size_t(n_layers) * layer_floats(); }
  size_t block_bytes() const { return block_floats() * sizeof(float); }
  size_t bytes_per_token() const { return 2 * size_t(n_layers) * row_floats() * sizeof(float); }
};

// Read/write view of the block storage (owned by the block pool).
struct KvStorage {
  float* base = nullptr;  // [n_blocks, block_floats]
  KvLayout layout;
  int64_t n_blocks = 0;
  // K row of (block, layer, slot): [n_kv_heads, head_dim]
  float* k(int32_t block, int layer, int slot) const {
    return base + size_t(block) * layout.block_floats() + size_t(layer) * layout.layer_floats() +
           size_t(slot) * layout.row_floats();
  }
  float* v(int32_t block, int layer, int slot) const {
    return k(block, layer, slot) + size_t(layout.block_size) * layout.row_floats();
  }
};

}  // namespace kvs
