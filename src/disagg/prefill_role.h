// A prefill worker inside `kvserve serve --role prefill`: requests run with
// Request::hand_off, and the sink of each is wrapped so that its hand-off
// event (prompt prefilled, first token sampled, sequence held) is shipped
// to the decode worker on a shipper thread, the sequence released, and the
// event passed on carrying the outcome: HandedOff with the adoption handle,
// Rejected(DecodeNoRoom) with the decode side's retry-after, or Error.
// The connection opens on the first shipment and reopens after a failure,
// so a prefill worker may start before its decode worker.
#pragma once
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "disagg/prefill_endpoint.h"
#include "sched/engine_loop.h"
#include "sched/executor.h"

namespace kvs::disagg {

class PrefillRole {
 public:
  PrefillRole(sched::PagedExecutor& exec, sched::EngineLoop& loop, const PrefillOptions& opts,
              std::function<void(const std::string&)> log);
  // Shipments still queued fail (their sequences are released).
  ~PrefillRole();
  PrefillRole(const PrefillRole&) = delete;
  PrefillRole& operator=(const PrefillRole&) = delete;
  // The sink to submit a hand_off request of caller scope `scope` with.
  sched::EventSink wrap(sched::EventSink next, const Scope& scope);
  TransferStats stats() const;
  std::string peer() const { return opts_.host + ":" + std::to_string(opts_.port); }

 private:
  struct Job {
    Shipment s;
    sched::TokenEvent e;
    sched::EventSink next;
  };
  bool take(sched::TokenEvent&& e, const sched::EventSink& next, const Scope& scope);  // engine thread
  void run();
  void ship_one(Job& j);
  void finish(Job& j, const ShipResult& r);

  sched::PagedExecutor& exec_;
  sched::EngineLoop& loop_;
  PrefillOptions opts_;
  std::function<void(const std::string&)> log_;
  KvIdentity me_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::unique_ptr<PrefillEndpoint> link_;  // shipper thread; swapped under mu_
  TransferStats past_;                     // of connections closed, under mu_
  std::thread th_;
};

}  // namespace kvs::disagg
