// What the paged engine asks of the KV tiers below the RAM pool (disk, Redis:
// src/tiers). Declared here so the engine depends on the idea, not on a
// storage library. Blocks are named by their chained, scope-bound key
// (prefix_hash.h), which already binds tenant, permission version and model.
//
//   offer()     a block was just keyed into the prefix index: copy its bytes
//               and write them behind (never waits; may drop when the queue is
//               full)
//   prefetch()  a request arrived: fetch its chain's blocks that RAM lacks,
//               in order, until the first miss, into staging memory
//   pending()   that fetch is still running (the request waits at the head
//               of the queue, as for a prefix being computed)
//   take()      admission: copy a staged block into a fresh pool block
//   drop_scope  a revoked scope: unreachable now, deleted in the background
//
// offer/take/drop_scope: the engine thread. prefetch/pending: any thread.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kv/prefix_hash.h"

namespace kvs {

class KvTierPort {
 public:
  virtual ~KvTierPort() = default;
  // `parent`: the chain's previous block (nullptr for the first), so a
  // tier with its own eviction keeps a chain's head longer than its tail.
  virtual void offer(const BlockKey& key, const Scope& scope, std::span<const uint8_t> block,
                     const BlockKey* parent = nullptr) = 0;
  // `retention_s` (> 0) is how long the scope's tenant lets its blocks be
  // kept; 0 = the tier's default. Returns 0 when there is nothing to wait for.
  virtual uint64_t prefetch(std::vector<BlockKey> chain, const Scope& scope, double retention_s) = 0;
  virtual bool pending(uint64_t ticket) const = 0;
  // How long a finished fetch took, seconds (< 0: unknown or running).
  virtual double seconds(uint64_t ticket) const = 0;
  // Copies the staged bytes of `key` into `dst` (block_bytes long) and
  // forgets them; false when nothing is staged under it.
  virtual bool take(const BlockKey& key, std::span<uint8_t> dst) = 0;
  virtual bool staged(const BlockKey& key) const = 0;
  virtual void drop_scope(const Scope& scope) = 0;
};

// Engine thread, inside KvManager::add_sequence: supplies the bytes of blocks
// the RAM index missed.
class BlockImporter {
 public:
  virtual ~BlockImporter() = default;
  virtual bool ready(const BlockKey& key) = 0;
  // Writes the block's K/V into pool block `block` (fresh, owned alone);
  // false leaves it unused.
  virtual bool fill(const BlockKey& key, int32_t block) = 0;
};

}  // namespace kvs
