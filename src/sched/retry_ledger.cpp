#include "sched/retry_ledger.h"

#include <algorithm>
#include <string>
#include <string_view>

namespace kvs::sched {

int64_t RetryLedger::booked_before(double t) const {
  int64_t n = 0;
  for (const Entry& e : entries_)
    if (e.at < t) n += e.tokens;
  return n;
}

void RetryLedger::book(uint64_t fp, double at, int64_t tokens) {
  redeem(fp);
  entries_.push_back({fp, at, tokens});
}

std::optional<double> RetryLedger::redeem(uint64_t fp) {
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.fp == fp; });
  if (it == entries_.end()) return std::nullopt;
  const double at = it->at;
  entries_.erase(it);
  return at;
}

void RetryLedger::expire(double now) {
  std::erase_if(entries_, [&](const Entry& e) { return now > e.at + grace_; });
}

uint64_t request_fingerprint(const Scope& scope, const std::string& tenant, std::span<const int32_t> prompt) {
  // FNV-1a over the bytes: a lookup key in process memory, not a secret.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(scope.bytes.data(), scope.bytes.size());
  mix(tenant.data(), tenant.size());
  mix(prompt.data(), prompt.size_bytes());
  return h;
}

}  // namespace kvs::sched
