// Owner of the KV memory: n_blocks blocks laid out as KvLayout says,
// allocated once (page-aligned, huge pages where large, zeroed) and never
// resized. Who may write which block is decided above (block pool /
// sequence), not here.
#pragma once
#include <cstdint>
#include <span>
#include "kernels/kv_layout.h"

namespace kvs {

class BlockStorage {
 public:
  BlockStorage(const KvLayout& layout, int64_t n_blocks);  // throws std::bad_alloc / invalid_argument
  ~BlockStorage();
  BlockStorage(const BlockStorage&) = delete;
  BlockStorage& operator=(const BlockStorage&) = delete;
  const KvStorage& view() const { return view_; }
  int64_t n_blocks() const { return view_.n_blocks; }
  size_t bytes() const { return size_t(view_.n_blocks) * view_.layout.block_bytes(); }
  // All K/V bytes of one block (every layer), for copies to and from a
  // lower tier. Throws std::out_of_range for a bad id.
  std::span<uint8_t> block(int32_t b);
  std::span<const uint8_t> block(int32_t b) const { return const_cast<BlockStorage*>(this)->block(b); }
  // Copies all K/V of block `src` into `dst` (copy-on-write).
  void copy_block(int32_t dst, int32_t src);

 private:
  KvStorage view_;
};

}  // namespace kvs
