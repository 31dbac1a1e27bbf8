// A picture of the block pool for the dashboard: each block's state, ref
// count and owner, folded into at most `max_cells` cells so that a pool of
// any size costs the page and the wire about the same.
//
// The owner of a block is the scope it was computed under (a SHA-256 output,
// so it names no tenant and no text), shortened to a 32-bit tag: a keyed
// block's own scope, otherwise the scope of a sequence that holds it. Tag 0
// means "no owner" (a free block). The caller maps tags to whatever it shows.
//
// Threads: reads the pool and the sequences' tables without a lock, so only
// the thread that mutates the KvManager (the engine thread, between steps)
// may call it. The result is plain data that any thread may read.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_manager.h"

namespace kvs {

// The 32-bit tag of a scope (never 0).
uint32_t owner_tag(const Scope& scope);

struct PoolCells {
  int32_t total = 0, free = 0, cached = 0, used = 0;
  int32_t group = 1;  // blocks per cell; the last cell may hold fewer
  // Per cell: blocks free / cached / used, used blocks with ref count > 1,
  // the highest ref count, and the index into `owners` of the owner holding
  // the most of its non-free blocks (-1: none).
  std::vector<int32_t> n_free, n_cached, n_used, n_shared, max_ref, owner;
  std::vector<uint32_t> owners;  // distinct owner tags, in first-seen order
  // Per owner (same index): blocks used and cached under it.
  std::vector<int32_t> owner_used, owner_cached;
  // The hybrid cache (kernels/kv_groups.h): per cell, the KV table serving
  // most of its non-free blocks (-1: none); per table, its used blocks.
  int32_t n_tables = 1;
  std::vector<int32_t> table, table_used;
  int32_t cells() const { return int32_t(n_free.size()); }
};

// Snapshot of `kv`'s pool in at most max_cells (>= 1) cells.
PoolCells snapshot_pool(const KvManager& kv, int32_t max_cells);

}  // namespace kvs
