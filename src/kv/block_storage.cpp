#include "kv/block_storage.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/huge_pages.h"

namespace kvs {

BlockStorage::BlockStorage(const KvLayout& layout, int64_t n_blocks) {
  layout.validate();
  if (n_blocks < 1) throw std::invalid_argument("KV storage needs at least one block");
  view_.layout = layout;
  view_.n_blocks = n_blocks;
  // Huge pages where it is large: attention walks the blocks of every
  // sequence, so 4 KiB pages would cost a TLB miss every few blocks.
  void* p = map_large(bytes());
  std::memset(p, 0, bytes());  // touch now: no page faults mid-request, RSS is honest
  view_.base = static_cast<uint8_t*>(p);
}

BlockStorage::~BlockStorage() { unmap_large(view_.base, bytes()); }

std::span<uint8_t> BlockStorage::block(int32_t b) {
  if (b < 0 || b >= view_.n_blocks) throw std::out_of_range("block id " + std::to_string(b) + " out of range");
  const size_t n = view_.layout.block_bytes();
  return {view_.base + size_t(b) * n, n};
}

void BlockStorage::copy_block(int32_t dst, int32_t src) {
  if (dst < 0 || src < 0 || dst >= view_.n_blocks || src >= view_.n_blocks)
    throw std::out_of_range("copy_block: block id out of range");
  const size_t n = view_.layout.block_bytes();
  std::memcpy(view_.base + size_t(dst) * n, view_.base + size_t(src) * n, n);
}

}  // namespace kvs
