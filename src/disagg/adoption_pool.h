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
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "disagg/kv_identity.h"
#include "engine/paged_engine.h"

namespace kvs::disagg {

class AdoptionPool {
 public:
  struct Reservation {
    SeqId seq = -1;                          // -1: not reserved (error says why; empty = no room)
    int32_t hit_blocks = 0;                  // table[0, hit_blocks) were in the prefix index
    std::vector<std::span<uint8_t>> blocks;  // memory of table[hit_blocks, n): where the bytes land
    std::span<float> residual;               // the sequence's full-precision residual (quantized cache)
    std::string error;
  };
  virtual ~AdoptionPool() = default;
  virtual KvIdentity identity() const = 0;
  // The chain keys this pool would give the prompt's full blocks.
  virtual std::vector<BlockKey> chain_keys(std::span<const int32_t> prompt, const Scope& caller) const = 0;
  virtual Reservation reserve(std::span<const int32_t> prompt, const Scope& caller) = 0;
  virtual void finish(SeqId seq, std::span<const int32_t> prompt) = 0;
  virtual void abort(SeqId seq) = 0;
};

// Over a PagedEngine that the engine thread also drives: every call takes
// `mu`, the lock the engine thread holds around its own calls.
class PagedAdoptionPool final : public AdoptionPool {
 public:
  PagedAdoptionPool(PagedEngine& pe, std::mutex& mu);
  KvIdentity identity() const override { return id_; }
  std::vector<BlockKey> chain_keys(std::span<const int32_t> prompt, const Scope& caller) const override;
  Reservation reserve(std::span<const int32_t> prompt, const Scope& caller) override;
  void finish(SeqId seq, std::span<const int32_t> prompt) override;
  void abort(SeqId seq) override;

 private:
  PagedEngine& pe_;
  std::mutex& mu_;
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
  std::vector<std::span<const uint8_t>> blocks;  // every block of the prompt's table, in order
  std::vector<float> residual;                   // copied: small, and the engine may reuse the sequence's
};

// `seq` holds exactly the prompt's K/V (prefilled, the first token sampled
// but not yet fed). Throws std::invalid_argument otherwise.
Shipment shipment_of(PagedEngine& pe, SeqId seq, const Scope& caller, int32_t first_token);

}  // namespace kvs::disagg
