// A lower KV tier's storage: named, opaque, already-sealed entries (the tier
// set encrypts before put and checks after get). One implementation per
// medium: DiskStore (files), RedisStore (a redis-server shared by replicas).
//
// Threads: a store is driven by its tier set's worker thread only; the
// counters it reports (bytes, evictions, available) are atomics any thread
// may read.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvs::tiers {

using ScopeFp = std::array<uint8_t, 16>;  // fingerprint of a prefix-cache scope

struct BlobMeta {
  ScopeFp scope{};
  int64_t expires_unix = 0;  // wall-clock second after which the entry must not be served
  // The entry of the chain's previous block ("" for a chain's first): a
  // store with its own eviction keeps it longer than this one, since a
  // block is of use only after every block before it.
  std::string parent;
};

// Skipped: not stored, as it would be the first entry out (the store is
// full and its parent is already the least recently used).
enum class PutStatus { Stored, Exists, NoRoom, Failed, Skipped };
enum class GetStatus { Hit, Miss, Failed };

class BlobStore {
 public:
  virtual ~BlobStore() = default;
  virtual const char* name() const = 0;  // metric label: "disk", "redis"
  // Stores `blob` under `id` (hex). Exists: already there (its LRU position
  // is refreshed, nothing written). NoRoom: larger than the store's whole
  // capacity. Failed: the medium failed (logged by the store).
  virtual PutStatus put(const std::string& id, std::span<const uint8_t> blob, const BlobMeta& meta) = 0;
  virtual GetStatus get(const std::string& id, std::vector<uint8_t>& out) = 0;
  // Marks an entry just used (a store without its own order ignores it).
  virtual void touch(const std::string& /*id*/) {}
  virtual void erase(const std::string& id) = 0;
  // Deletes every entry of a scope (a revoke); returns how many.
  virtual int64_t erase_scope(const ScopeFp& scope) = 0;
  // Deletes entries whose expiry has passed; returns how many.
  virtual int64_t sweep_expired(int64_t now_unix) = 0;
  virtual int64_t bytes() const = 0;      // bytes held now
  virtual int64_t evictions() const = 0;  // entries dropped for capacity
  virtual bool available() const { return true; }
};

}  // namespace kvs::tiers
