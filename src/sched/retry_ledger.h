// Promised comebacks. Every 429 that says "retry after T" books the
// request's prompt tokens at T, so the next client turned away is told a
// later time instead of the same one: without it a burst's rejected clients
// all return in the same second, and most are turned away again.
//
// A returning client is recognised by its request's fingerprint (scope,
// tenant and prompt, hashed; never stored as text) and its booking is
// redeemed: it is real queued work from then on. A booking whose client
// never came back lapses a grace period after its time.
//
// Not thread-safe: the scheduler calls it under its mutex.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/prefix_hash.h"

namespace kvs::sched {

class RetryLedger {
 public:
  explicit RetryLedger(double grace_s = 5.0) : grace_(grace_s) {}

  // Tokens booked by clients told to come back before `t` (all of them
  // when t is +infinity).
  int64_t booked_before(double t) const;
  // Books `tokens` for the client with fingerprint `fp`, due at `at`
  // (replaces an older booking of the same client).
  void book(uint64_t fp, double at, int64_t tokens);
  // The client came back: its booking leaves the ledger. Returns the time
  // it was told, if it had a booking.
  std::optional<double> redeem(uint64_t fp);
  // Drops bookings more than the grace period past their time.
  void expire(double now);
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t fp;
    double at;
    int64_t tokens;
  };
  double grace_;
  std::vector<Entry> entries_;  // few: one per client turned away recently
};

// Identifies a request across retries: same scope, tenant and prompt.
uint64_t request_fingerprint(const Scope& scope, const std::string& tenant, std::span<const int32_t> prompt);

}  // namespace kvs::sched
