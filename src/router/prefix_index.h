// Which worker holds which KV block: block hash -> set of workers, kept from
// the workers' KV-cache events (and from the router's own placements until
// the events confirm them). Workers are numbered 0..63.
//
// A prompt's score on a worker is the number of its leading blocks the
// worker holds: block i only counts if blocks 0..i-1 do too, as a prefix
// cache can only reuse an unbroken chain. Thread-safe (one mutex).
#pragma once
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "events/kv_event_codec.h"

namespace kvs::router {

class PrefixIndex {
 public:
  static constexpr int kMaxWorkers = 64;

  // One decoded batch from worker `w`: Stored adds, Removed drops,
  // AllBlocksCleared forgets everything the worker held.
  void apply(int w, const events::WireBatch& batch);
  // The router sent a prompt with these block hashes to `w`: count them as
  // held now, before the worker's events arrive.
  void predict(int w, const std::vector<uint64_t>& hashes);
  // Forget worker `w` (down, restarted, or its event stream was reset).
  void clear_worker(int w);

  // Leading blocks of `hashes` held by each of `n_workers` workers.
  std::vector<int> leading_hits(const std::vector<uint64_t>& hashes, int n_workers) const;
  size_t size() const;  // distinct block hashes known

 private:
  void add(int w, uint64_t h);
  void remove(int w, uint64_t h);
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, uint64_t> holders_;  // hash -> worker bit mask
};

}  // namespace kvs::router
