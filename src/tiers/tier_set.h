// The KV tiers below the RAM pool, as the paged engine sees them
// (kv/kv_tier_port.h): write-behind of newly keyed blocks and prefetch of a
// prompt's missing blocks, over one or more stores (disk, then Redis), with
// every entry sealed under its scope's own key (sealed_block.h).
//
// One worker thread does all store I/O and all encryption, so the engine
// thread only ever copies bytes: offer() copies a block into the bounded
// write-behind queue (dropped, and counted, when the queue is full), take()
// copies a staged block into the pool. Fetches go before writes.
//
// Keys: scope key = derive_key(master, "kv-tier-block", scope bytes). The
// scope already folds in tenant, permission version, retention epoch and
// model, so a revoked tenant's old entries cannot be opened even by the new
// scope, and nothing opens without the master key file.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "crypto/secret_key.h"
#include "kv/kv_tier_port.h"
#include "tiers/blob_store.h"
#include "tiers/sealed_block.h"

namespace kvs::tiers {

struct TierSetOptions {
  int64_t queue_bytes = int64_t(256) << 20;    // write-behind bound (block bytes waiting)
  int64_t staging_bytes = int64_t(512) << 20;  // fetched blocks waiting for admission
  double default_retention_s = 86400;          // --kv-retention: for scopes without their own
  double staged_ttl_s = 30;                    // a staged block nobody took is dropped after this
  double sweep_period_s = 5;                   // expiry sweep of the stores
};

struct TierCounters {
  std::string tier;
  int64_t hits = 0, misses = 0, stores = 0, evictions = 0, errors = 0, bytes = 0;
  bool available = true;
};

struct TierSetStats {
  std::vector<TierCounters> tiers;
  int64_t dropped_writes = 0;  // blocks not written because the queue was full
  int64_t queue_bytes = 0, staged_bytes = 0;
};

class TierSet final : public KvTierPort {
 public:
  using Log = std::function<void(const std::string&)>;
  TierSet(const crypto::SecretKey& master, TierIdentity id, std::vector<std::unique_ptr<BlobStore>> stores,
          TierSetOptions opts = {}, Log log = {});
  ~TierSet() override;  // finishes queued writes, then stops the worker

  void offer(const BlockKey& key, const Scope& scope, std::span<const uint8_t> block,
             const BlockKey* parent = nullptr) override;
  uint64_t prefetch(std::vector<BlockKey> chain, const Scope& scope, double retention_s) override;
  bool pending(uint64_t ticket) const override;
  double seconds(uint64_t ticket) const override;
  bool take(const BlockKey& key, std::span<uint8_t> dst) override;
  bool staged(const BlockKey& key) const override;
  void drop_scope(const Scope& scope) override;

  // Blocks until every queued write and scope drop is done (tests, shutdown).
  void flush();
  TierSetStats stats() const;
  const TierIdentity& identity() const { return id_; }

 private:
  struct Write {
    BlockKey key;
    Scope scope;
    int64_t expires = 0;
    std::vector<uint8_t> bytes;
    std::optional<BlockKey> parent;  // the chain's previous block
  };
  struct Fetch {
    uint64_t ticket = 0;
    std::vector<BlockKey> chain;
    Scope scope;
    double t0 = 0;
  };
  struct Staged {
    std::vector<uint8_t> bytes;
    Scope scope;
    double at = 0;
  };
  struct Counters {
    std::atomic<int64_t> hits{0}, misses{0}, stores{0}, errors{0};
  };

  void run();
  void run_fetch(Fetch& f);
  // `rejected`: set when a store held a bad entry for the key.
  bool load_one(const BlockKey& key, const crypto::SecretKey& k, std::vector<uint8_t>& plain, bool& rejected);
  void run_write(Write& w);
  void housekeeping(double now);
  double retention_of(const Scope& scope) const;  // mu_ held
  void log(const std::string& s) const {
    if (log_) log_(s);
  }

  crypto::SecretKey master_;
  TierIdentity id_;
  std::vector<std::unique_ptr<BlobStore>> stores_;
  std::vector<std::unique_ptr<Counters>> counters_;
  TierSetOptions opts_;
  Log log_;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  bool stop_ = false;
  bool busy_ = false;  // the worker is running a write or a drop
  std::deque<Write> writes_;
  int64_t queue_bytes_ = 0;
  std::deque<Fetch> fetches_;
  std::deque<Scope> drops_;
  std::set<uint64_t> running_;                     // tickets not finished
  std::unordered_map<uint64_t, double> took_;      // finished tickets -> seconds (bounded)
  std::deque<uint64_t> took_order_;
  uint64_t next_ticket_ = 1;
  std::unordered_map<BlockKey, Staged, BlockKeyHash> staged_;
  int64_t staged_bytes_ = 0;
  std::unordered_map<std::string, double> retention_;  // scope bytes -> seconds
  std::set<std::array<uint8_t, 32>> revoked_;
  std::atomic<int64_t> dropped_writes_{0};
  double next_sweep_ = 0;
  std::thread worker_;
};

}  // namespace kvs::tiers
