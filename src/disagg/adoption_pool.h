// The decode worker's KV pool as an incoming transfer sees it, and the
// PagedEngine behind it on both sides of a transfer.
//
// Decode side: reserve() pins the prompt's blocks the pool already has (its
// prefix index: they are not sent) and reserves fresh blocks for the rest,
// whose bytes the link then writes straight into pool memory; finish() keys
// them into the prefix index; abort() gives every block back.
// Prefill side: shipment_of() names the bytes of a prefilled sequence.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "disagg/kv_identity.h"
#include "engine/paged_engine.h"
#include "sched/pool_command.h"

namespace kvs::disagg {

class AdoptionPool {
 public:
  using Reservation = sched::AdoptionSlots;
  virtual ~AdoptionPool() = default;
  virtual KvIdentity identity() const = 0;
  // The chain keys this pool would give the prompt's full blocks.
  virtual std::vector<BlockKey> chain_keys(std::span<const int32_t> prompt, const Scope& caller) const = 0;
  virtual Reservation reserve(std::span<const int32_t> prompt, const Scope& caller) = 0;
  // "" once the blocks are keyed (the sequence may be claimed from then
  // on), else why not; the caller then aborts it.
  virtual std::string finish(SeqId seq, std::span<const int32_t> prompt) = 0;
  virtual void abort(SeqId seq) = 0;
};

// Over the pool of a PagedEngine whose one writer drains `inbox` (the
// engine loop; sched/pool_command.h): the calling thread (UCX progress)
// never touches the pool itself. reserve() and finish() post their command
// and wait for the answer, at most one engine step (finish must be applied
// before the prefill side hears of the handle, or a claim could overtake
// it); abort() is posted without waiting. chain_keys() is pure and runs here.
class PagedAdoptionPool final : public AdoptionPool {
 public:
  PagedAdoptionPool(const PagedEngine& pe, sched::PoolInbox& inbox);
  KvIdentity identity() const override { return id_; }
  std::vector<BlockKey> chain_keys(std::span<const int32_t> prompt, const Scope& caller) const override;
  Reservation reserve(std::span<const int32_t> prompt, const Scope& caller) override;
  std::string finish(SeqId seq, std::span<const int32_t> prompt) override;
  void abort(SeqId seq) override;

 private:
  const PagedEngine& pe_;
  sched::PoolInbox& inbox_;
  KvIdentity id_;
};

KvIdentity identity_of(const PagedEngine& pe);

// What a prefill worker sends for one prefilled sequence: views into its
// pool, valid while the sequence is held and not stepped.
struct Shipment {
  std::vector<int32_t> prompt;
  Scope scope;                                   // the caller scope (not folded)
  int32_t first_token = -1;
  std::vector<BlockKey> keys;                    // chain keys of the prompt's full blocks
  // Every block of the prompt's table, in order; a hybrid cache: block by
  // block, each KV table's entry the next query sees (a windowed table's
  // hidden ones are not sent), the order KvManager::Adoption lists them in.
  std::vector<std::span<const uint8_t>> blocks;
  std::vector<float> residual;                   // copied: small, and the engine may reuse the sequence's
};

// `seq` holds exactly the prompt's K/V (prefilled, the first token sampled
// but not yet fed). Throws std::invalid_argument otherwise.
Shipment shipment_of(PagedEngine& pe, SeqId seq, const Scope& caller, int32_t first_token);

}  // namespace kvs::disagg
