// Changes to the prefix index as plain data, for publishers outside the
// engine thread (KV-cache events, docs/SCALE-OUT.md). When a log is attached
// (KvManager::set_event_log), the pool and the manager append one event per
// block as it happens, on the engine thread, and never look at it again: the
// owner takes the events between two calls (std::vector::swap) and hands
// them on. Without a log nothing is recorded.
//
//   Stored   a full block was keyed into the prefix index (parent = the key
//            of the block before it in the chain, if any)
//   Removed  a block's key left the index: evicted for reuse, or dropped by a
//            revoke (KvManager::drop_cached_scope), a retention sweep or a
//            cold-cache request (drop_cached)
#pragma once
#include <cstdint>
#include <vector>

#include "kv/prefix_hash.h"

namespace kvs {

struct KvEvent {
  enum class Kind : uint8_t { Stored, Removed };
  Kind kind = Kind::Stored;
  int32_t block = -1;           // physical block id (tests, logs)
  int32_t table = 0;            // Stored: the KV table it serves (kernels/kv_groups.h); keys of
                                // table t > 0 are kv/prefix_chain.h's table_key of the chain key
  BlockKey key{};
  bool has_parent = false;      // Stored: false for a chain's first block
  BlockKey parent{};
  std::vector<int32_t> tokens;  // Stored, when KvEventLog::tokens: the block's token ids
};

struct KvEventLog {
  bool tokens = false;  // record each stored block's token ids (prompt content)
  std::vector<KvEvent> events;
};

}  // namespace kvs
