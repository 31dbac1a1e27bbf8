// The block pool: who holds which KV block. Pure bookkeeping over block ids
// 0 .. n-1 (the memory itself is BlockStorage); every operation is O(1).
//
// Each block is in exactly one state:
//   Free    ref 0, no key      on the free list (a stack: recently freed first)
//   Cached  ref 0, keyed       on the LRU list; its K/V are still valid and a
//                              prefix lookup may revive it
//   Used    ref >= 1           in at least one block table; may be keyed
// Keyed (content-addressed) blocks are full blocks registered in the prefix
// index (key -> block). allocate() takes a Free block first and only when
// none is left evicts the least recently used Cached block (dropping its
// key). The pool is the only owner of ref counts; callers say share/release.
//
// Running out of blocks is a normal condition: allocate() returns nothing and
// the caller (scheduler) decides whom to preempt.
//
// Threads: one thread (the engine thread, kv/owner_thread.h) calls
// everything that changes the pool, and builds with assertions check it.
// The one exception is lookup(), which any thread may call at any time: the
// prefix index has its own reader/writer lock, so an HTTP thread can
// estimate a prompt's cached prefix at submit while a forward keys and
// evicts blocks.
//
// Each keyed block also records the scope it was keyed under and its last use
// (the pool's tick when it was keyed, shared or released; the caller sets the
// tick, the pool reads no clock), so the cache of one scope can be dropped at
// once (a revoked tenant) or by age (a retention TTL). Misuse (releasing a free
// block, sharing an unknown id) is a bug and throws std::logic_error.
#pragma once
#include <cstdint>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "kv/kv_events.h"
#include "kv/owner_thread.h"
#include "kv/prefix_hash.h"

namespace kvs {

enum class BlockState : uint8_t { Free, Cached, Used };

// A scope's first four bytes, never 0: a compact owner fingerprint, which the
// pool keeps per keyed block so a whole-pool snapshot reads four bytes, not
// the scope, per cached block.
inline uint32_t scope_tag(const Scope& s) {
  const uint32_t t = uint32_t(s.bytes[0]) | uint32_t(s.bytes[1]) << 8 | uint32_t(s.bytes[2]) << 16 |
                     uint32_t(s.bytes[3]) << 24;
  return t == 0 ? 1u : t;
}
const char* to_string(BlockState s);

class BlockPool {
 public:
  explicit BlockPool(int32_t n_blocks);  // throws std::invalid_argument when n_blocks < 1

  int32_t size() const { return n_; }
  int32_t n_free() const { return int32_t(free_.size()); }
  int32_t n_cached() const { return n_cached_; }
  int32_t n_used() const { return n_used_; }
  // Blocks allocate() can hand out right now (free + evictable).
  int32_t n_available() const { return n_free() + n_cached_; }

  // One block with ref count 1, or nothing when every block is Used.
  std::optional<int32_t> allocate();
  // n blocks appended to `out`, all or nothing. Returns false (out untouched)
  // when fewer than n are available.
  bool allocate(int32_t n, std::vector<int32_t>& out);

  // One more holder: Used -> ref + 1; Cached -> Used with ref 1 (leaves the LRU).
  void share(int32_t b);
  // One holder fewer; at ref 0 a keyed block becomes Cached (most recently
  // used end of the LRU), an unkeyed one Free.
  void release(int32_t b);

  // Prefix index. lookup() does not change any state (the caller shares the
  // block it decides to use). Thread-safe (see above); the block it names
  // may be evicted as soon as it returns unless the caller is the engine thread.
  std::optional<int32_t> lookup(const BlockKey& key) const;
  // Registers Used block `b` under `key`. Returns false, changing nothing,
  // when the key already names another block (same content computed twice:
  // the first copy stays the cached one) or `b` already has a key.
  // `scope` is recorded for drop_scope / drop_cached_older_than.
  bool set_key(int32_t b, const BlockKey& key, const Scope& scope = Scope{});

  // The current time as the caller counts it (monotonic, any unit); stamped
  // as the last use of keyed blocks. Starts at 0.
  void set_tick(int64_t tick) {
    owner_.check("BlockPool::set_tick");
    tick_ = tick;
  }
  int64_t tick() const { return tick_; }
  // Every Cached block keyed under `scope` becomes Free and leaves the index;
  // Used blocks of that scope lose their key (they can no longer be found and
  // go Free, not Cached, when their last holder releases them). Returns the
  // number of Cached blocks freed.
  int32_t drop_scope(const Scope& scope);
  // Cached blocks of `scope` last used before `cutoff` become Free. Returns
  // how many. Used blocks are not touched.
  int32_t drop_cached_older_than(const Scope& scope, int64_t cutoff);
  // Last use tick / scope of a keyed block (tests, debug).
  int64_t last_use(int32_t b) const { return last_use_[check(b)]; }
  const Scope& scope_of(int32_t b) const;  // throws if !has_key(b)

  // Every Cached block becomes Free and leaves the index (e.g. a cold-start
  // measurement, or the model's scope being retired).
  void drop_cached();

  int32_t ref_count(int32_t b) const { return ref_[check(b)]; }
  BlockState state(int32_t b) const { return state_[check(b)]; }
  bool has_key(int32_t b) const { return keyed_[check(b)]; }
  const BlockKey& key(int32_t b) const;  // throws if !has_key(b)

  // The whole pool at once, for a snapshot on the engine thread (element b
  // is block b; a scope tag is meaningful only where the block is keyed). The
  // per-block accessors above check the id on every call.
  const BlockState* states() const { return state_.data(); }
  const int32_t* refs() const { return ref_.data(); }
  const uint32_t* scope_tags() const { return scope_tags_.data(); }  // scope_tag(scope), where keyed

  // Cached blocks in eviction order (next victim first); O(n), for tests/debug.
  std::vector<int32_t> lru_order() const;
  // Free blocks in allocation order (next allocated first); O(n).
  std::vector<int32_t> free_order() const;
  int64_t evictions() const { return evictions_; }

  // Appends a Removed event to `log` (not owned; null = none) whenever a key
  // leaves the index. Stored events come from KvManager, which knows the
  // parent key and the tokens.
  void set_event_log(KvEventLog* log) {
    owner_.check("BlockPool::set_event_log");
    events_ = log;
  }
  // The calling thread changes the pool from now on (the engine thread).
  void bind_owner_thread() const { owner_.bind(); }

  // Checks every structural invariant in O(n); throws std::logic_error naming
  // the first violation. Used by tests after every operation.
  void check_invariants() const;

 private:
  int32_t check(int32_t b) const;
  void lru_push_back(int32_t b);
  void lru_unlink(int32_t b);
  int32_t take(int32_t b);  // b (Free or Cached, already unlinked) -> Used, ref 1
  void free_cached(int32_t b);  // Cached -> Free, key dropped
  void index_erase(const BlockKey& key);
  void note_removed(int32_t b);  // Removed event for keyed block b

  int32_t n_;
  std::vector<int32_t> ref_;
  std::vector<BlockState> state_;
  std::vector<uint8_t> keyed_;
  std::vector<BlockKey> keys_;
  std::vector<Scope> scopes_;        // scope a keyed block was keyed under
  std::vector<uint32_t> scope_tags_;  // scope_tag(scopes_[b])
  std::vector<int64_t> last_use_;    // tick of the last set_key / share / release
  int64_t tick_ = 0;
  std::vector<int32_t> free_;          // stack; back() is allocated next
  std::vector<int32_t> prev_, next_;   // LRU links, -1 = none
  int32_t lru_head_ = -1, lru_tail_ = -1;  // head = next victim, tail = most recent
  int32_t n_cached_ = 0, n_used_ = 0;
  int64_t evictions_ = 0;
  KvEventLog* events_ = nullptr;
  OwnerThread owner_;
  // Written by the engine thread under a unique lock; read by lookup()
  // under a shared one (from any thread).
  mutable std::shared_mutex index_mu_;
  std::unordered_map<BlockKey, int32_t, BlockKeyHash> index_;
};

}  // namespace kvs
