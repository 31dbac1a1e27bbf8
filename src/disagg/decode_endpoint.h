// The decode worker's side of KV transfers: listens on a UCX address,
// checks each prefill worker's handshake, and for each offer reserves pool
// blocks before any byte moves (RAM hits pinned, the rest fresh), receives
// the missing blocks straight into them, keys them on completion and holds
// the adopted sequence until the decode scheduler claims it.
//
// Any failure frees what the transfer reserved: a garbled or truncated
// message, a block of the wrong size or index, a peer that disconnects or
// stalls past transfer_timeout_s, and an adoption nobody claims within
// claim_timeout_s. A block still being received is released only once UCX
// is done writing it.
//
// Anyone who can post to a prefill worker makes it hand a prompt over
// here, so adoptions no request has come for yet are bounded: beyond
// unclaimed_max_blocks (the newest adoption aside) the oldest of them are
// freed. One whose request has arrived (await_claim) is not counted: it
// waits in the decode queue, under that queue's admission control.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "disagg/adoption_pool.h"
#include "disagg/transfer_stats.h"

namespace kvs::disagg {

struct DecodeOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                // 0: any free port (see port())
  double transfer_timeout_s = 10;   // offer to done
  double claim_timeout_s = 30;      // done to claim
  uint32_t retry_after_ms = 1000;   // told to the prefill side with "no room"
  int64_t unclaimed_max_blocks = 0; // adoptions no request came for, the newest aside; 0: no bound
};

// A sequence whose prompt K/V arrived: the scheduler continues it by
// feeding first_token at position prompt.size().
struct Adopted {
  SeqId seq = -1;
  std::vector<int32_t> prompt;
  Scope scope;
  int32_t first_token = -1;
  int32_t received_blocks = 0, skipped_blocks = 0;
};

class DecodeEndpoint {
 public:
  // Throws std::runtime_error when UCX cannot listen on the address.
  DecodeEndpoint(AdoptionPool& pool, const DecodeOptions& opts, std::function<void(const std::string&)> log = {});
  ~DecodeEndpoint();
  DecodeEndpoint(const DecodeEndpoint&) = delete;
  DecodeEndpoint& operator=(const DecodeEndpoint&) = delete;
  uint16_t port() const { return port_; }
  // Any thread: hands over the adopted sequence named by a transfer's
  // handle, once. nullopt when unknown, already claimed or expired.
  std::optional<Adopted> claim(uint64_t handle);
  // Any thread: the request for `handle` arrived and waits for its claim.
  // While the returned hold lives the adoption does not count against
  // unclaimed_max_blocks; dropped before the claim (the request ended
  // first), the adoption is freed at once. Safe to drop after the endpoint.
  // An empty hold (use_count 0) when the handle is unknown or awaited already.
  std::shared_ptr<void> await_claim(uint64_t handle);
  // Any thread: blocks held by adoptions no request has come for yet.
  int64_t unclaimed_blocks() const;
  // Any thread: transfers with blocks reserved and not yet adopted or
  // freed, plus adoptions not yet claimed.
  int64_t holding() const;
  TransferStats stats() const { return counters_.snapshot(); }

 private:
  struct State;
  std::shared_ptr<State> st_;  // shared: a hold may outlive the endpoint
  uint16_t port_ = 0;
  TransferCounters counters_;
};

}  // namespace kvs::disagg
