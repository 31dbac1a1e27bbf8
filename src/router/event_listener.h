// Subscribes to every worker's KV-event stream (vLLM's format) and keeps the
// prefix index current. One thread, one SUB socket per worker (so a batch's
// sender is known) and a DEALER for replays:
//   - sequences are tracked per worker; a gap is filled from the worker's
//     replay socket (its buffered batches), the first batch seen triggers a
//     replay from 0 so the index covers what was cached before the router
//     started;
//   - a batch at or below the last sequence is a replay/duplicate: ignored
//     and counted, except sequence 0 starting with AllBlocksCleared, which is
//     a restarted worker: its entries are dropped;
//   - malformed messages are ignored and counted;
//   - each stream's handshakes are watched (a ZeroMQ socket monitor): a
//     failed one (CURVE keys that do not match, a key the worker refuses)
//     is counted and logged once per run of failures, since the stream
//     itself just stays silent;
//   - a stream that stays silent while the router sends the worker requests
//     (--events-stale) is treated as stopped: the worker counts as holding
//     nothing (still routable) until its events come back.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "events/curve_keys.h"
#include "router/prefix_index.h"
#include "router/workers.h"

namespace kvs::router {

class EventListener {
 public:
  EventListener(const WorkerSet& workers, PrefixIndex& index, std::optional<events::CurveKeys> curve,
                double stale_s);
  ~EventListener();  // stops the thread

  void start();
  // Worker i's cache is unknown from now on (down, or back up after a
  // restart): drop its entries and start its sequence afresh.
  void reset(int i);
  // The router just sent worker i a request (for the staleness check).
  void routed(int i);
  // False while worker i's stream counts as stopped. A worker without an
  // event stream is scored from the router's own placements only: live.
  bool live(int i) const;
  // True while worker i's event stream is connected (its handshake
  // succeeded and it has not dropped since).
  bool connected(int i) const;

  struct Stats {
    int64_t batches = 0, replayed = 0, duplicates = 0, malformed = 0, restarts = 0, gaps_unfilled = 0;
    int64_t handshake_failures = 0;
  };
  Stats stats(int i) const;
  std::string metrics_text() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvs::router
