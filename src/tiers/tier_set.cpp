#include "tiers/tier_set.h"

#include <chrono>
#include <cstring>
#include <ctime>

#include "crypto/kdf.h"

namespace kvs::tiers {

static double mono_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static int64_t unix_s() { return int64_t(std::time(nullptr)); }
static std::string scope_str(const Scope& s) { return std::string(s.bytes.begin(), s.bytes.end()); }
static constexpr size_t kMaxTook = 4096;  // finished tickets remembered for seconds()

TierSet::TierSet(const crypto::SecretKey& master, TierIdentity id, std::vector<std::unique_ptr<BlobStore>> stores,
                 TierSetOptions opts, Log log)
    : master_(master), id_(id), stores_(std::move(stores)), opts_(opts), log_(std::move(log)) {
  for (size_t i = 0; i < stores_.size(); ++i) counters_.push_back(std::make_unique<Counters>());
  worker_ = std::thread([this] { run(); });
}

TierSet::~TierSet() {
  flush();
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

double TierSet::retention_of(const Scope& scope) const {
  auto it = retention_.find(scope_str(scope));
  return it != retention_.end() && it->second > 0 ? it->second : opts_.default_retention_s;
}

void TierSet::offer(const BlockKey& key, const Scope& scope, std::span<const uint8_t> block, const BlockKey* parent) {
  if (block.size() != id_.block_bytes) return;
  {
    std::lock_guard lk(mu_);
    if (revoked_.count(scope.bytes)) return;
    if (queue_bytes_ + int64_t(block.size()) > opts_.queue_bytes) {
      dropped_writes_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  // The copy is the engine thread's only cost; outside the lock, so fetch
  // status checks from other threads never wait for it.
  Write w{key, scope, 0, std::vector<uint8_t>(block.begin(), block.end()), {}};
  if (parent) w.parent = *parent;
  {
    std::lock_guard lk(mu_);
    w.expires = unix_s() + int64_t(retention_of(scope));
    queue_bytes_ += int64_t(w.bytes.size());
    writes_.push_back(std::move(w));
  }
  cv_.notify_one();
}

uint64_t TierSet::prefetch(std::vector<BlockKey> chain, const Scope& scope, double retention_s) {
  std::lock_guard lk(mu_);
  if (retention_s > 0) retention_[scope_str(scope)] = retention_s;
  if (chain.empty() || revoked_.count(scope.bytes)) return 0;
  Fetch f{next_ticket_++, std::move(chain), scope, mono_s()};
  running_.insert(f.ticket);
  const uint64_t t = f.ticket;
  fetches_.push_back(std::move(f));
  cv_.notify_one();
  return t;
}

bool TierSet::pending(uint64_t ticket) const {
  std::lock_guard lk(mu_);
  return running_.count(ticket) != 0;
}

double TierSet::seconds(uint64_t ticket) const {
  std::lock_guard lk(mu_);
  auto it = took_.find(ticket);
  return it == took_.end() ? -1 : it->second;
}

bool TierSet::staged(const BlockKey& key) const {
  std::lock_guard lk(mu_);
  return staged_.count(key) != 0;
}

bool TierSet::take(const BlockKey& key, std::span<uint8_t> dst) {
  std::lock_guard lk(mu_);
  auto it = staged_.find(key);
  if (it == staged_.end() || it->second.bytes.size() != dst.size()) return false;
  std::memcpy(dst.data(), it->second.bytes.data(), dst.size());
  staged_bytes_ -= int64_t(it->second.bytes.size());
  staged_.erase(it);
  return true;
}

void TierSet::drop_scope(const Scope& scope) {
  std::lock_guard lk(mu_);
  if (!revoked_.insert(scope.bytes).second) return;
  for (auto it = staged_.begin(); it != staged_.end();) {
    if (it->second.scope == scope) {
      staged_bytes_ -= int64_t(it->second.bytes.size());
      it = staged_.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(writes_, [&](const Write& w) {
    if (!(w.scope == scope)) return false;
    queue_bytes_ -= int64_t(w.bytes.size());
    return true;
  });
  drops_.push_back(scope);
  cv_.notify_one();
}

void TierSet::flush() {
  std::unique_lock lk(mu_);
  idle_cv_.wait(lk, [&] { return (writes_.empty() && drops_.empty() && fetches_.empty() && !busy_) || stop_; });
}

TierSetStats TierSet::stats() const {
  TierSetStats s;
  for (size_t i = 0; i < stores_.size(); ++i) {
    TierCounters c;
    c.tier = stores_[i]->name();
    c.hits = counters_[i]->hits;
    c.misses = counters_[i]->misses;
    c.stores = counters_[i]->stores;
    c.errors = counters_[i]->errors;
    c.evictions = stores_[i]->evictions();
    c.bytes = stores_[i]->bytes();
    c.available = stores_[i]->available();
    s.tiers.push_back(c);
  }
  s.dropped_writes = dropped_writes_;
  std::lock_guard lk(mu_);
  s.queue_bytes = queue_bytes_;
  s.staged_bytes = staged_bytes_;
  return s;
}

void TierSet::run() {
  std::unique_lock lk(mu_);
  while (true) {
    const bool write_ready = !writes_.empty();
    if (stop_ && fetches_.empty() && drops_.empty() && !write_ready) break;
    if (!fetches_.empty()) {
      Fetch f = std::move(fetches_.front());
      fetches_.pop_front();
      busy_ = true;
      lk.unlock();
      run_fetch(f);
      lk.lock();
      busy_ = false;
      running_.erase(f.ticket);
      took_[f.ticket] = mono_s() - f.t0;
      took_order_.push_back(f.ticket);
      if (took_order_.size() > kMaxTook) {
        took_.erase(took_order_.front());
        took_order_.pop_front();
      }
    } else if (!drops_.empty()) {
      const Scope s = drops_.front();
      drops_.pop_front();
      busy_ = true;
      lk.unlock();
      const ScopeFp fp = scope_fingerprint(s);
      int64_t n = 0;
      for (auto& st : stores_) n += st->erase_scope(fp);
      log("kv tier: revoked scope, " + std::to_string(n) + " entries deleted");
      lk.lock();
      busy_ = false;
    } else if (write_ready) {
      Write w = std::move(writes_.front());
      writes_.pop_front();
      busy_ = true;
      lk.unlock();
      run_write(w);
      lk.lock();
      busy_ = false;
      queue_bytes_ -= int64_t(w.bytes.size());
    } else {
      idle_cv_.notify_all();
      const double now = mono_s();
      if (now >= next_sweep_) {
        next_sweep_ = now + opts_.sweep_period_s;
        lk.unlock();
        housekeeping(now);
        lk.lock();
        continue;
      }
      cv_.wait_for(lk, std::chrono::duration<double>(std::max(0.01, next_sweep_ - now)));
    }
  }
  idle_cv_.notify_all();
}

// Stages the chain's blocks in order until the first one no store has.
// After a bad entry the rest of the chain is deleted too: the request
// recomputes and offers all of it, and an entry already there would keep
// its place (a write never replaces one), so bad entries further on would
// stay until some request reached each of them.
void TierSet::run_fetch(Fetch& f) {
  const crypto::SecretKey k = crypto::derive_key(master_, "kv-tier-block", f.scope.bytes);
  std::vector<uint8_t> plain;
  std::vector<std::string> used;
  for (size_t i = 0; i < f.chain.size(); ++i) {
    const BlockKey& key = f.chain[i];
    {
      std::lock_guard lk(mu_);
      if (staged_.count(key)) continue;
      if (staged_bytes_ + int64_t(id_.block_bytes) > opts_.staging_bytes || revoked_.count(f.scope.bytes)) break;
    }
    bool rejected = false;
    if (!load_one(key, k, plain, rejected)) {
      if (rejected)
        for (size_t j = i + 1; j < f.chain.size(); ++j)
          for (auto& st : stores_) st->erase(entry_id(f.chain[j], id_));
      break;
    }
    used.push_back(entry_id(key, id_));
    std::lock_guard lk(mu_);
    staged_bytes_ += int64_t(plain.size());
    staged_[key] = Staged{std::move(plain), f.scope, mono_s()};
    plain = {};
  }
  // Read head first, the chain is touched tail first: its head, of use to
  // every later prompt that shares any of it, is the last to be evicted.
  for (auto it = used.rbegin(); it != used.rend(); ++it)
    for (auto& st : stores_) st->touch(*it);
}

// One block from the first store that has a valid entry. A bad entry
// (tampered, truncated, wrong key, another model, expired) is a miss: logged
// by its hashed id, counted, deleted, never served.
bool TierSet::load_one(const BlockKey& key, const crypto::SecretKey& k, std::vector<uint8_t>& plain, bool& rejected) {
  const std::string id = entry_id(key, id_);
  std::vector<uint8_t> blob;
  for (size_t i = 0; i < stores_.size(); ++i) {
    BlobStore& st = *stores_[i];
    const GetStatus g = st.get(id, blob);
    if (g == GetStatus::Failed) {
      ++counters_[i]->errors;
      continue;
    }
    if (g == GetStatus::Miss) {
      ++counters_[i]->misses;
      continue;
    }
    plain.resize(id_.block_bytes);
    const OpenStatus o = open_block(k, key, id_, blob, unix_s(), plain);
    if (o == OpenStatus::Ok) {
      ++counters_[i]->hits;
      return true;
    }
    if (o != OpenStatus::Expired) {
      rejected = true;
      ++counters_[i]->errors;
      log(std::string("kv tier ") + st.name() + ": entry " + id.substr(0, 12) + " rejected (" + to_string(o) +
          "); deleted, recomputing");
    } else {
      ++counters_[i]->misses;
    }
    st.erase(id);
  }
  return false;
}

void TierSet::run_write(Write& w) {
  const crypto::SecretKey k = crypto::derive_key(master_, "kv-tier-block", w.scope.bytes);
  EntryHeader h;
  h.scope = scope_fingerprint(w.scope);
  h.created_unix = unix_s();
  h.expires_unix = w.expires;
  const std::vector<uint8_t> blob = seal_block(k, w.key, id_, h, w.bytes);
  const BlobMeta meta{h.scope, h.expires_unix, w.parent ? entry_id(*w.parent, id_) : std::string()};
  const std::string id = entry_id(w.key, id_);
  for (size_t i = 0; i < stores_.size(); ++i) {
    switch (stores_[i]->put(id, blob, meta)) {
      case PutStatus::Stored: ++counters_[i]->stores; break;
      case PutStatus::Exists: break;
      case PutStatus::NoRoom:
        if (counters_[i]->errors++ == 0)
          log(std::string("kv tier ") + stores_[i]->name() + ": one block entry (" + std::to_string(blob.size()) +
              " bytes) is larger than the tier's capacity; nothing can be stored, raise its size");
        break;
      case PutStatus::Failed: ++counters_[i]->errors; break;
      case PutStatus::Skipped: break;  // the store is full of this chain's earlier blocks
    }
  }
}

void TierSet::housekeeping(double now) {
  const int64_t t = unix_s();
  for (auto& st : stores_) st->sweep_expired(t);
  std::lock_guard lk(mu_);
  for (auto it = staged_.begin(); it != staged_.end();) {
    if (now - it->second.at > opts_.staged_ttl_s) {
      staged_bytes_ -= int64_t(it->second.bytes.size());
      it = staged_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace kvs::tiers
