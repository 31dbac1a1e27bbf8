// Counters of KV transfers, the same on both sides (kvserve_kv_transfer_*):
// blocks and bytes moved, blocks skipped because the decode side had them,
// seconds spent from offer to result, transfers that ended in failure.
#pragma once
#include <atomic>
#include <cstdint>

namespace kvs::disagg {

struct TransferStats {
  int64_t transfers = 0, failed = 0, no_room = 0;
  int64_t blocks = 0, bytes = 0, skipped_blocks = 0;
  int64_t unclaimed_released = 0;  // decode: adoptions freed over the unclaimed bound
  double seconds = 0;
  TransferStats& operator+=(const TransferStats& o) {
    transfers += o.transfers;
    failed += o.failed;
    no_room += o.no_room;
    blocks += o.blocks;
    bytes += o.bytes;
    skipped_blocks += o.skipped_blocks;
    unclaimed_released += o.unclaimed_released;
    seconds += o.seconds;
    return *this;
  }
};

class TransferCounters {
 public:
  void add_ok(int64_t blocks, int64_t bytes, int64_t skipped, double seconds) {
    transfers_ += 1;
    blocks_ += blocks;
    bytes_ += bytes;
    skipped_ += skipped;
    micros_ += int64_t(seconds * 1e6);
  }
  void add_failed() { failed_ += 1; }
  void add_no_room() { no_room_ += 1; }
  void add_unclaimed_released() { released_ += 1; }
  TransferStats snapshot() const {
    TransferStats s;
    s.transfers = transfers_.load();
    s.failed = failed_.load();
    s.no_room = no_room_.load();
    s.blocks = blocks_.load();
    s.bytes = bytes_.load();
    s.skipped_blocks = skipped_.load();
    s.unclaimed_released = released_.load();
    s.seconds = double(micros_.load()) / 1e6;
    return s;
  }

 private:
  std::atomic<int64_t> transfers_{0}, failed_{0}, no_room_{0}, blocks_{0}, bytes_{0}, skipped_{0}, micros_{0};
  std::atomic<int64_t> released_{0};
};

}  // namespace kvs::disagg
