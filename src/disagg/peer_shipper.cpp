#include "disagg/peer_shipper.h"

namespace kvs::disagg {

PeerShipper::PeerShipper(const KvIdentity& mine, const PrefillOptions& opts,
                         std::function<void(const std::string&)> log)
    : me_(mine), opts_(opts), log_(std::move(log)), peer_(opts.host + ":" + std::to_string(opts.port)) {
  th_ = std::thread([this] { run(); });
}

PeerShipper::~PeerShipper() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  th_.join();
  for (ShipJob& j : jobs_) {
    ShipResult r;
    r.reason = "the prefill worker is shutting down";
    if (j.done) j.done(r);
  }
}

void PeerShipper::post(ShipJob j) {
  {
    std::lock_guard lk(mu_);
    jobs_.push_back(std::move(j));
  }
  cv_.notify_one();
}

void PeerShipper::run() {
  std::unique_lock lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    ShipJob j = std::move(jobs_.front());
    jobs_.pop_front();
    lk.unlock();
    const ShipResult r = ship_one(j.s);
    if (j.done) j.done(r);
    lk.lock();
  }
}

ShipResult PeerShipper::ship_one(const Shipment& s) {
  ShipResult r;
  try {
    if (!link_) {
      auto l = std::make_unique<PrefillEndpoint>(me_, opts_, log_);
      std::lock_guard lk(mu_);
      link_ = std::move(l);
    }
    r = link_->ship(s);
  } catch (const HandshakeError& ex) {
    r.status = ShipResult::Status::Refused;
    r.reason = ex.what();
  } catch (const std::exception& ex) {
    r.status = ShipResult::Status::Failed;
    // PrefillEndpoint's own errors name the worker and its address already.
    const std::string what = ex.what();
    r.reason = what.find(peer_) != std::string::npos ? what : "decode worker " + peer_ + " unreachable: " + what;
  }
  if (r.status == ShipResult::Status::Failed || r.status == ShipResult::Status::Refused) {
    if (r.status == ShipResult::Status::Refused && log_) log_("hand-over refused by " + peer_ + ": " + r.reason);
    std::lock_guard lk(mu_);
    if (link_ && !link_->connected()) {  // reopened (with a new handshake) by the next shipment
      past_ += link_->stats();
      link_.reset();
    }
  }
  return r;
}

TransferStats PeerShipper::stats() const {
  std::lock_guard lk(mu_);
  TransferStats s = past_;
  if (link_) s += link_->stats();
  return s;
}

}  // namespace kvs::disagg
