// One decode worker as a prefill worker's destination: its own queue, its
// own shipper thread and its own UCX connection, so a slow or dead decode
// worker delays only the hand-overs routed to it. The connection opens on
// the first shipment and reopens (with a new handshake) after a failure, so
// a prefill worker may start before its decode workers.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "disagg/prefill_endpoint.h"

namespace kvs::disagg {

struct ShipJob {
  Shipment s;
  // Called once, on the shipper thread (or in the destructor for a job never
  // shipped), when UCX reads the shipment's memory no more.
  std::function<void(const ShipResult&)> done;
};

class PeerShipper {
 public:
  PeerShipper(const KvIdentity& mine, const PrefillOptions& opts, std::function<void(const std::string&)> log);
  // Jobs still queued fail with "shutting down".
  ~PeerShipper();
  PeerShipper(const PeerShipper&) = delete;
  PeerShipper& operator=(const PeerShipper&) = delete;

  void post(ShipJob j);
  TransferStats stats() const;
  // HOST:PORT as given.
  const std::string& peer() const { return peer_; }

 private:
  void run();
  ShipResult ship_one(const Shipment& s);

  KvIdentity me_;
  PrefillOptions opts_;
  std::function<void(const std::string&)> log_;
  std::string peer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ShipJob> jobs_;
  bool stop_ = false;
  std::unique_ptr<PrefillEndpoint> link_;  // shipper thread; swapped under mu_
  TransferStats past_;                     // of connections closed, under mu_
  std::thread th_;
};

}  // namespace kvs::disagg
