#include "disagg/prefill_role.h"

namespace kvs::disagg {

using sched::FinishReason;

PrefillRole::PrefillRole(sched::PagedExecutor& exec, sched::EngineLoop& loop, const PrefillOptions& opts,
                         std::function<void(const std::string&)> log)
    : exec_(exec), loop_(loop), opts_(opts), log_(std::move(log)), me_(identity_of(exec.paged())) {
  th_ = std::thread([this] { run(); });
}

PrefillRole::~PrefillRole() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  th_.join();
  for (Job& j : jobs_) {
    ShipResult r;
    r.reason = "the prefill worker is shutting down";
    finish(j, r);
  }
}

sched::EventSink PrefillRole::wrap(sched::EventSink next, const Scope& scope) {
  return [this, next = std::move(next), scope](sched::TokenEvent&& e) {
    if (e.finish == FinishReason::HandedOff && e.hand_off) return take(std::move(e), next, scope);
    return next ? next(std::move(e)) : true;
  };
}

// On the engine thread, between steps: the sequence's block table and bytes
// are stable here, and stay so while it is held (nothing steps it).
bool PrefillRole::take(sched::TokenEvent&& e, const sched::EventSink& next, const Scope& scope) {
  Job j;
  j.next = next;
  try {
    j.s = shipment_of(exec_.paged(), e.hand_off->seq, scope, e.hand_off->first_token);
  } catch (const std::exception& ex) {
    j.e = std::move(e);
    ShipResult r;
    r.reason = ex.what();
    finish(j, r);
    return true;
  }
  j.e = std::move(e);
  {
    std::lock_guard lk(mu_);
    jobs_.push_back(std::move(j));
  }
  cv_.notify_one();
  return true;
}

void PrefillRole::run() {
  std::unique_lock lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    Job j = std::move(jobs_.front());
    jobs_.pop_front();
    lk.unlock();
    ship_one(j);
    lk.lock();
  }
}

void PrefillRole::ship_one(Job& j) {
  ShipResult r;
  try {
    if (!link_) {
      auto l = std::make_unique<PrefillEndpoint>(me_, opts_, log_);
      std::lock_guard lk(mu_);
      link_ = std::move(l);
    }
    r = link_->ship(j.s);
  } catch (const HandshakeError& ex) {
    r.status = ShipResult::Status::Refused;
    r.reason = ex.what();
  } catch (const std::exception& ex) {
    r.status = ShipResult::Status::Failed;
    r.reason = std::string("decode worker ") + peer() + " unreachable: " + ex.what();
  }
  if (r.status == ShipResult::Status::Failed || r.status == ShipResult::Status::Refused) {
    if (r.status == ShipResult::Status::Refused && log_) log_("hand-over refused by " + peer() + ": " + r.reason);
    std::lock_guard lk(mu_);
    if (link_ && !link_->connected()) {  // reopened (with a new handshake) by the next shipment
      past_ += link_->stats();
      link_.reset();
    }
  }
  finish(j, r);
}

// The sequence goes back to the engine loop whatever happened (ship()
// returns only once UCX reads its blocks no more); the event tells the
// client's side the outcome.
void PrefillRole::finish(Job& j, const ShipResult& r) {
  sched::HandOff& h = *j.e.hand_off;
  loop_.release_held(h.seq);
  h.handle = r.handle;
  h.blocks = r.blocks_sent;
  h.skipped_blocks = r.blocks_skipped;
  h.bytes = r.bytes;
  h.seconds = r.seconds;
  if (r.status == ShipResult::Status::NoRoom) {
    j.e.finish = FinishReason::Rejected;
    j.e.reject_reason = sched::RejectReason::DecodeNoRoom;
    j.e.retry_after_s = r.retry_after_s > 0 ? r.retry_after_s : 1.0;
    j.e.message = "the decode worker has no free KV blocks; retry later";
  } else if (r.status != ShipResult::Status::Ok) {
    j.e.finish = FinishReason::Error;
    j.e.message = "KV hand-over to the decode worker failed: " + r.reason;
  }
  if (j.next) j.next(std::move(j.e));
}

TransferStats PrefillRole::stats() const {
  std::lock_guard lk(mu_);
  TransferStats s = past_;
  if (link_) s += link_->stats();
  return s;
}

}  // namespace kvs::disagg
