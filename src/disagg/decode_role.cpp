#include "disagg/decode_role.h"

#include <algorithm>

namespace kvs::disagg {

DecodeRole::DecodeRole(sched::PagedExecutor& exec, sched::PoolInbox& inbox, const DecodeOptions& opts,
                       std::function<void(const std::string&)> log)
    : exec_(exec), pool_(exec.paged(), inbox), log_(std::move(log)) {
  endpoint_ = std::make_unique<DecodeEndpoint>(pool_, opts, log_);
  exec_.set_claimer([this](uint64_t h, std::span<const int32_t> p, const Scope& s) { return claim(h, p, s); });
}

// The request must be the one whose K/V arrived: a claim for another prompt
// or scope (a confused or hostile caller) frees the adoption rather than
// decoding someone else's context.
SeqId DecodeRole::claim(uint64_t handle, std::span<const int32_t> prompt, const Scope& caller) {
  std::optional<Adopted> a = endpoint_->claim(handle);
  if (!a) return -1;
  if (!std::equal(prompt.begin(), prompt.end(), a->prompt.begin(), a->prompt.end()) || !(a->scope == caller)) {
    if (log_) log_("handover " + std::to_string(handle) + " claimed for another prompt or scope: freed");
    exec_.release(a->seq);
    return -1;
  }
  return a->seq;
}

}  // namespace kvs::disagg
