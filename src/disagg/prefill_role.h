// A prefill worker inside `kvserve serve --role prefill`: requests run with
// Request::hand_off, and the sink of each is wrapped so that its hand-off
// event (prompt prefilled, first token sampled, sequence held) is shipped
// to the request's decode worker, the sequence released, and the event
// passed on carrying the outcome: HandedOff with the adoption handle,
// Rejected(DecodeNoRoom) with the decode side's retry-after, or Error.
//
// The decode workers it may ship to are fixed at start (`--decode-peer`,
// repeatable): a request names one of them (the router's choice) or gets the
// first. Each has its own PeerShipper, so one slow decode worker does not
// hold up hand-overs to the others.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "disagg/peer_shipper.h"
#include "sched/engine_loop.h"
#include "sched/executor.h"

namespace kvs::disagg {

class PrefillRole {
 public:
  // `peers`: at least one.
  PrefillRole(sched::PagedExecutor& exec, sched::EngineLoop& loop, const std::vector<PrefillOptions>& peers,
              std::function<void(const std::string&)> log);
  // Shipments still queued fail (their sequences are released).
  ~PrefillRole();
  PrefillRole(const PrefillRole&) = delete;
  PrefillRole& operator=(const PrefillRole&) = delete;
  // The index of decode peer HOST:PORT (as given to --decode-peer), or -1.
  int peer_index(const std::string& host_port) const;
  // The sink to submit a hand_off request of caller scope `scope` with; its
  // blocks go to peer `peer` (peer_index; 0 is the default).
  sched::EventSink wrap(sched::EventSink next, const Scope& scope, int peer = 0);
  // All peers together.
  TransferStats stats() const;
  std::vector<std::string> peers() const;

 private:
  bool take(sched::TokenEvent&& e, const sched::EventSink& next, const Scope& scope, int peer);  // engine thread
  void finish(sched::TokenEvent& e, const sched::EventSink& next, const ShipResult& r);

  sched::PagedExecutor& exec_;
  sched::EngineLoop& loop_;
  std::vector<std::unique_ptr<PeerShipper>> shippers_;
};

}  // namespace kvs::disagg
