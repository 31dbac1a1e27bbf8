#include "kv/block_pool.h"

#include <mutex>
#include <stdexcept>
#include <string>

namespace kvs {

const char* to_string(BlockState s) {
  switch (s) {
    case BlockState::Free: return "free";
    case BlockState::Cached: return "cached";
    case BlockState::Used: return "used";
  }
  return "?";
}

static std::logic_error bug(const std::string& what) { return std::logic_error("block pool: " + what); }

BlockPool::BlockPool(int32_t n_blocks) : n_(n_blocks) {
  if (n_blocks < 1) throw std::invalid_argument("block pool needs at least one block, got " + std::to_string(n_blocks));
  ref_.assign(n_, 0);
  state_.assign(n_, BlockState::Free);
  keyed_.assign(n_, 0);
  keys_.resize(n_);
  scopes_.resize(n_);
  scope_tags_.assign(n_, 0);
  last_use_.assign(n_, 0);
  prev_.assign(n_, -1);
  next_.assign(n_, -1);
  // Stack with block 0 on top, so a fresh pool hands out 0, 1, 2, ...
  free_.reserve(n_);
  for (int32_t b = n_ - 1; b >= 0; --b) free_.push_back(b);
  index_.reserve(size_t(n_));
}

int32_t BlockPool::check(int32_t b) const {
  if (b < 0 || b >= n_) throw bug("block id " + std::to_string(b) + " out of range [0, " + std::to_string(n_) + ")");
  return b;
}

const BlockKey& BlockPool::key(int32_t b) const {
  if (!keyed_[check(b)]) throw bug("block " + std::to_string(b) + " has no key");
  return keys_[b];
}

const Scope& BlockPool::scope_of(int32_t b) const {
  if (!keyed_[check(b)]) throw bug("block " + std::to_string(b) + " has no key");
  return scopes_[b];
}

void BlockPool::lru_push_back(int32_t b) {
  prev_[b] = lru_tail_;
  next_[b] = -1;
  if (lru_tail_ >= 0) next_[lru_tail_] = b;
  else lru_head_ = b;
  lru_tail_ = b;
}

void BlockPool::lru_unlink(int32_t b) {
  if (prev_[b] >= 0) next_[prev_[b]] = next_[b];
  else lru_head_ = next_[b];
  if (next_[b] >= 0) prev_[next_[b]] = prev_[b];
  else lru_tail_ = prev_[b];
  prev_[b] = next_[b] = -1;
}

int32_t BlockPool::take(int32_t b) {
  state_[b] = BlockState::Used;
  ref_[b] = 1;
  ++n_used_;
  return b;
}

std::optional<int32_t> BlockPool::allocate() {
  owner_.check("BlockPool::allocate");
  if (!free_.empty()) {
    const int32_t b = free_.back();
    free_.pop_back();
    return take(b);
  }
  if (lru_head_ < 0) return std::nullopt;
  // Evict: the victim's K/V are about to be overwritten, so its key must go
  // before anyone can look it up again.
  const int32_t b = lru_head_;
  lru_unlink(b);
  note_removed(b);
  index_erase(keys_[b]);
  keyed_[b] = 0;
  --n_cached_;
  ++evictions_;
  return take(b);
}

bool BlockPool::allocate(int32_t n, std::vector<int32_t>& out) {
  owner_.check("BlockPool::allocate");
  if (n < 0) throw bug("allocate: negative count");
  if (n > n_available()) return false;
  for (int32_t i = 0; i < n; ++i) out.push_back(*allocate());
  return true;
}

void BlockPool::share(int32_t b) {
  owner_.check("BlockPool::share");
  last_use_[check(b)] = tick_;
  switch (state_[b]) {
    case BlockState::Used: ++ref_[b]; return;
    case BlockState::Cached:
      lru_unlink(b);
      --n_cached_;
      take(b);
      return;
    case BlockState::Free: throw bug("share of free block " + std::to_string(b));
  }
}

void BlockPool::release(int32_t b) {
  owner_.check("BlockPool::release");
  if (state_[check(b)] != BlockState::Used) throw bug("release of " + std::string(to_string(state_[b])) + " block " + std::to_string(b));
  last_use_[b] = tick_;
  if (--ref_[b] > 0) return;
  --n_used_;
  if (keyed_[b]) {
    state_[b] = BlockState::Cached;
    lru_push_back(b);
    ++n_cached_;
  } else {
    state_[b] = BlockState::Free;
    free_.push_back(b);
  }
}

void BlockPool::note_removed(int32_t b) {
  if (!events_) return;
  KvEvent e;
  e.kind = KvEvent::Kind::Removed;
  e.block = b;
  e.key = keys_[b];
  events_->events.push_back(std::move(e));
}

void BlockPool::index_erase(const BlockKey& key) {
  std::unique_lock lk(index_mu_);
  index_.erase(key);
}

std::optional<int32_t> BlockPool::lookup(const BlockKey& key) const {
  std::shared_lock lk(index_mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

bool BlockPool::set_key(int32_t b, const BlockKey& key, const Scope& scope) {
  owner_.check("BlockPool::set_key");
  if (state_[check(b)] != BlockState::Used) throw bug("set_key on " + std::string(to_string(state_[b])) + " block " + std::to_string(b));
  if (keyed_[b]) return false;
  {
    std::unique_lock lk(index_mu_);
    if (!index_.emplace(key, b).second) return false;
  }
  keys_[b] = key;
  scopes_[b] = scope;
  scope_tags_[b] = scope_tag(scope);
  keyed_[b] = 1;
  last_use_[b] = tick_;
  return true;
}

void BlockPool::free_cached(int32_t b) {
  lru_unlink(b);
  note_removed(b);
  index_erase(keys_[b]);
  keyed_[b] = 0;
  --n_cached_;
  state_[b] = BlockState::Free;
  free_.push_back(b);
}

void BlockPool::drop_cached() {
  owner_.check("BlockPool::drop_cached");
  while (lru_head_ >= 0) free_cached(lru_head_);
}

int32_t BlockPool::drop_scope(const Scope& scope) {
  owner_.check("BlockPool::drop_scope");
  int32_t dropped = 0;
  for (int32_t b = 0; b < n_; ++b) {
    if (!keyed_[b] || !(scopes_[b] == scope)) continue;
    if (state_[b] == BlockState::Cached) {
      free_cached(b);
      ++dropped;
    } else {  // Used: unfindable from now on, Free when released
      note_removed(b);
      index_erase(keys_[b]);
      keyed_[b] = 0;
    }
  }
  return dropped;
}

int32_t BlockPool::drop_cached_older_than(const Scope& scope, int64_t cutoff) {
  owner_.check("BlockPool::drop_cached_older_than");
  int32_t dropped = 0;
  for (int32_t b = lru_head_; b >= 0;) {
    const int32_t next = next_[b];
    if (last_use_[b] < cutoff && scopes_[b] == scope) {
      free_cached(b);
      ++dropped;
    }
    b = next;
  }
  return dropped;
}

std::vector<int32_t> BlockPool::lru_order() const {
  std::vector<int32_t> out;
  for (int32_t b = lru_head_; b >= 0; b = next_[b]) out.push_back(b);
  return out;
}

std::vector<int32_t> BlockPool::free_order() const { return {free_.rbegin(), free_.rend()}; }

void BlockPool::check_invariants() const {
  auto fail = [](const std::string& s) { throw bug("invariant: " + s); };
  std::vector<uint8_t> seen(n_, 0);  // 1 = free list, 2 = LRU
  for (int32_t b : free_) {
    if (b < 0 || b >= n_) fail("free list holds bad id " + std::to_string(b));
    if (seen[b]) fail("block " + std::to_string(b) + " twice on the free list");
    seen[b] = 1;
  }
  int32_t cached = 0, prev = -1;
  for (int32_t b = lru_head_; b >= 0; b = next_[b]) {
    if (seen[b]) fail("block " + std::to_string(b) + " on the LRU and another list (or a cycle)");
    if (prev_[b] != prev) fail("LRU back link of block " + std::to_string(b) + " is broken");
    seen[b] = 2;
    prev = b;
    if (++cached > n_) fail("LRU list longer than the pool");
  }
  if (prev != lru_tail_) fail("LRU tail is not the last block of the list");
  int32_t used = 0;
  size_t keyed = 0;
  for (int32_t b = 0; b < n_; ++b) {
    const std::string id = "block " + std::to_string(b);
    switch (state_[b]) {
      case BlockState::Free:
        if (seen[b] != 1) fail(id + " is free but not on the free list");
        if (ref_[b] != 0 || keyed_[b]) fail(id + " is free but has a ref count or key");
        break;
      case BlockState::Cached:
        if (seen[b] != 2) fail(id + " is cached but not on the LRU list");
        if (ref_[b] != 0 || !keyed_[b]) fail(id + " is cached but has refs or no key");
        break;
      case BlockState::Used:
        if (seen[b] != 0) fail(id + " is used but on a list");
        if (ref_[b] < 1) fail(id + " is used with ref count " + std::to_string(ref_[b]));
        ++used;
        break;
    }
    if (keyed_[b]) {
      ++keyed;
      auto it = index_.find(keys_[b]);
      if (it == index_.end() || it->second != b) fail(id + " is keyed but the index does not map its key to it");
    }
  }
  if (keyed != index_.size()) fail("index holds keys of blocks that are not keyed");
  if (cached != n_cached_ || used != n_used_) fail("state counters disagree with the lists");
  if (n_free() + n_cached_ + n_used_ != n_) fail("free + cached + used != total");
}

}  // namespace kvs
