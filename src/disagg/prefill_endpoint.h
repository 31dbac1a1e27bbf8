// The prefill worker's side of KV transfers: one UCX connection to a decode
// worker, opened with the handshake, and ship(): offer the prompt and its
// chain keys, send only the blocks the decode side asks for (it already has
// the rest), then the residual, and wait for the decode side's result.
// A lost connection is reopened (with a new handshake) by the next ship().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "disagg/adoption_pool.h"
#include "disagg/transfer_stats.h"

namespace kvs::disagg {

struct PrefillOptions {
  std::string host = "127.0.0.1";  // the decode worker's UCX address
  uint16_t port = 0;
  double timeout_s = 10;           // handshake, and one transfer from offer to result
};

// The decode worker refused the handshake; what() names the fields that
// differ.
class HandshakeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ShipResult {
  enum class Status { Ok, NoRoom, Refused, Failed };
  Status status = Status::Failed;
  std::string reason;          // not Ok: one line for the client
  double retry_after_s = 0;    // NoRoom
  uint64_t handle = 0;         // Ok: DecodeEndpoint::claim
  int64_t blocks_sent = 0, blocks_skipped = 0, bytes = 0;
  double seconds = 0;          // offer to result
};
const char* to_string(ShipResult::Status s);

class PrefillEndpoint {
 public:
  // Connects and completes the handshake. Throws HandshakeError when the
  // decode worker refuses it, std::runtime_error when it is unreachable.
  PrefillEndpoint(const KvIdentity& mine, const PrefillOptions& opts, std::function<void(const std::string&)> log = {});
  ~PrefillEndpoint();
  PrefillEndpoint(const PrefillEndpoint&) = delete;
  PrefillEndpoint& operator=(const PrefillEndpoint&) = delete;
  // Any thread, several at once. Returns when the decode side answered (or
  // failed) and UCX reads the shipment's memory no more.
  ShipResult ship(const Shipment& s);
  bool connected() const;
  TransferStats stats() const { return counters_.snapshot(); }

 private:
  struct State;
  std::unique_ptr<State> st_;
  TransferCounters counters_;
};

}  // namespace kvs::disagg
