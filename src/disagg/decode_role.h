// A decode worker inside `kvserve serve --role decode`: the transfer
// endpoint adopting into the engine loop's own pool, and the claimer its
// scheduler uses to continue a handed-over request (Request::handover).
// Transfers reserve and adopt through the engine loop's inbox, so the
// engine thread stays the pool's one writer.
#pragma once
#include <memory>

#include "disagg/decode_endpoint.h"
#include "sched/executor.h"

namespace kvs::disagg {

class DecodeRole {
 public:
  // Throws std::runtime_error when UCX cannot listen on opts' address.
  DecodeRole(sched::PagedExecutor& exec, sched::PoolInbox& inbox, const DecodeOptions& opts,
             std::function<void(const std::string&)> log);
  uint16_t port() const { return endpoint_->port(); }
  TransferStats stats() const { return endpoint_->stats(); }
  int64_t holding() const { return endpoint_->holding(); }
  // DecodeEndpoint::await_claim and unclaimed_blocks.
  std::shared_ptr<void> await_claim(uint64_t handle) { return endpoint_->await_claim(handle); }
  int64_t unclaimed_blocks() const { return endpoint_->unclaimed_blocks(); }

 private:
  // Engine thread (from the scheduler's admission).
  SeqId claim(uint64_t handle, std::span<const int32_t> prompt, const Scope& caller);

  sched::PagedExecutor& exec_;
  PagedAdoptionPool pool_;
  std::unique_ptr<DecodeEndpoint> endpoint_;
  std::function<void(const std::string&)> log_;
};

}  // namespace kvs::disagg
