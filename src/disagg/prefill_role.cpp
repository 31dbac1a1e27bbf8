#include "disagg/prefill_role.h"

#include <stdexcept>

namespace kvs::disagg {

using sched::FinishReason;

PrefillRole::PrefillRole(sched::PagedExecutor& exec, sched::EngineLoop& loop, const std::vector<PrefillOptions>& peers,
                         std::function<void(const std::string&)> log)
    : exec_(exec), loop_(loop) {
  if (peers.empty()) throw std::invalid_argument("a prefill worker needs at least one decode peer");
  const KvIdentity me = identity_of(exec.paged());
  for (const PrefillOptions& o : peers) shippers_.push_back(std::make_unique<PeerShipper>(me, o, log));
}

// The shippers fail what they still hold, which releases those sequences
// through finish(): that needs the engine loop alive, which it is (the
// loop outlives the role).
PrefillRole::~PrefillRole() { shippers_.clear(); }

int PrefillRole::peer_index(const std::string& host_port) const {
  for (size_t i = 0; i < shippers_.size(); ++i)
    if (shippers_[i]->peer() == host_port) return int(i);
  return -1;
}

std::vector<std::string> PrefillRole::peers() const {
  std::vector<std::string> v;
  for (const auto& s : shippers_) v.push_back(s->peer());
  return v;
}

sched::EventSink PrefillRole::wrap(sched::EventSink next, const Scope& scope, int peer) {
  if (peer < 0 || size_t(peer) >= shippers_.size()) throw std::out_of_range("no such decode peer");
  return [this, next = std::move(next), scope, peer](sched::TokenEvent&& e) {
    if (e.finish == FinishReason::HandedOff && e.hand_off) return take(std::move(e), next, scope, peer);
    return next ? next(std::move(e)) : true;
  };
}

// On the engine thread, between steps: the sequence's block table and bytes
// are stable here, and stay so while it is held (nothing steps it).
bool PrefillRole::take(sched::TokenEvent&& e, const sched::EventSink& next, const Scope& scope, int peer) {
  ShipJob j;
  try {
    j.s = shipment_of(exec_.paged(), e.hand_off->seq, scope, e.hand_off->first_token);
  } catch (const std::exception& ex) {
    ShipResult r;
    r.reason = ex.what();
    finish(e, next, r);
    return true;
  }
  auto ev = std::make_shared<sched::TokenEvent>(std::move(e));
  j.done = [this, ev, next](const ShipResult& r) { finish(*ev, next, r); };
  shippers_[size_t(peer)]->post(std::move(j));
  return true;
}

// The sequence goes back to the engine loop whatever happened (the shipper
// calls this only once UCX reads its blocks no more); the event tells the
// client's side the outcome.
void PrefillRole::finish(sched::TokenEvent& e, const sched::EventSink& next, const ShipResult& r) {
  sched::HandOff& h = *e.hand_off;
  loop_.release_held(h.seq);
  h.handle = r.handle;
  h.blocks = r.blocks_sent;
  h.skipped_blocks = r.blocks_skipped;
  h.bytes = r.bytes;
  h.seconds = r.seconds;
  if (r.status == ShipResult::Status::NoRoom) {
    e.finish = FinishReason::Rejected;
    e.reject_reason = sched::RejectReason::DecodeNoRoom;
    e.retry_after_s = r.retry_after_s > 0 ? r.retry_after_s : 1.0;
    e.message = "the decode worker has no free KV blocks; retry later";
  } else if (r.status != ShipResult::Status::Ok) {
    e.finish = FinishReason::Error;
    e.message = "KV hand-over to the decode worker failed: " + r.reason;
  }
  if (next) next(std::move(e));
}

TransferStats PrefillRole::stats() const {
  TransferStats s;
  for (const auto& sh : shippers_) s += sh->stats();
  return s;
}

}  // namespace kvs::disagg
