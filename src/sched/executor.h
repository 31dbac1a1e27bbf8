// What the scheduler drives: a KV pool plus something that turns a batch of
// sequence chunks into logits (the core, StepExecutor), and two optional
// capabilities the scheduler asks for: lower KV tiers (TierPort) and
// disaggregated hand-over (HandoverPort). The real executor is a
// PagedEngine over the model; tests drive the scheduler with a fake one
// (tests/fake_executor.h) that keeps real KvManager bookkeeping and makes
// up logits.
//
// Threads: the engine thread calls everything that changes the pool
// (kv/owner_thread.h checks it in builds with assertions). Any thread may
// call kv() for its immutable options and its thread-safe prefix probe
// (cached_prefix_blocks, chain_keys), kv_scope(), n_vocab(), max_ctx(),
// tier() and every TierPort function.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/paged_engine.h"
#include "kv/kv_manager.h"

namespace kvs::sched {

// Lower KV tiers (PagedEngine::prefetch): staging a prompt's blocks while
// its request queues. Any thread.
class TierPort {
 public:
  virtual ~TierPort() = default;
  // A ticket for the fetch of the prompt's blocks RAM lacks; 0: nothing to wait for.
  virtual uint64_t prefetch(std::span<const int32_t> prompt, const Scope& caller, double retention_s) const = 0;
  virtual bool prefetch_pending(uint64_t ticket) const = 0;
  // Seconds a finished fetch took (< 0: unknown or still running).
  virtual double prefetch_seconds(uint64_t ticket) const = 0;
};

// Pool blocks reserved for a prompt whose K/V another worker computed.
struct AdoptionSlots {
  SeqId seq = -1;                          // -1: not reserved (error says why; empty = no room)
  // The prompt's block list (every KV table's blocks the first decode step
  // sees, block by block: KvManager::Adoption): its first hit_blocks were in
  // the prefix index (one table: table[0, hit_blocks)), `blocks` is the
  // memory of the rest, in list order, where the bytes land.
  int32_t hit_blocks = 0;
  std::vector<std::span<uint8_t>> blocks;
  std::span<float> residual;               // the sequence's full-precision residual (quantized cache)
  std::string error;
};

// Disaggregated serving, decode side. Engine thread (other threads reach it
// through the engine loop's inbox, sched/pool_command.h).
class HandoverPort {
 public:
  virtual ~HandoverPort() = default;
  // Pins the prompt's cached blocks and reserves the rest, all or nothing
  // (KvManager::reserve_adoption). The block memory may then be written by
  // another thread until finish_adoption.
  virtual AdoptionSlots reserve_adoption(std::span<const int32_t> prompt, const Scope& caller) = 0;
  // The reserved blocks hold the prompt's K/V: keyed as if computed here.
  virtual void finish_adoption(SeqId seq, std::span<const int32_t> prompt) = 0;
  // The sequence an adoption under `handle` made, holding exactly
  // `prompt`'s K/V in `caller`'s scope, now owned by the caller; -1 when
  // unknown, expired or not that prompt.
  virtual SeqId claim(uint64_t handle, std::span<const int32_t> prompt, const Scope& caller) = 0;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual const KvManager& kv() const = 0;
  // The scope as the KvManager keys blocks with (model identity bound in,
  // kv/prefix_chain.h), for prefix probes without side effects.
  virtual Scope kv_scope(const Scope& caller) const = 0;
  // use_cache false: no prefix hit (every prompt position is computed).
  virtual SeqAdmission add(std::span<const int32_t> prompt, const Scope& caller, bool use_cache) = 0;
  virtual SeqId fork(SeqId seq) = 0;
  virtual void release(SeqId seq) = 0;
  // All or nothing, as PagedEngine::step: ok == false means nothing ran.
  virtual StepResult step(const std::vector<SeqStep>& items) = 0;
  virtual int n_vocab() const = 0;
  virtual int max_ctx() const = 0;
  // Bytes of one pool block (metrics: bytes per KV table); 0 when unknown.
  virtual int64_t block_bytes() const { return 0; }
  // Prefix-cache upkeep (engine thread, between steps). Scopes are caller
  // scopes, bound like add() binds them. Return the cached blocks freed.
  virtual void set_tick(int64_t tick) = 0;
  virtual int32_t drop_cached_scope(const Scope& caller) = 0;
  virtual int32_t drop_cached_older_than(const Scope& caller, int64_t cutoff) = 0;
  // Every cached block of every scope (memory pressure sheds the prefix cache).
  virtual int32_t drop_all_cached() = 0;
  // Optional capabilities; null when this executor has none.
  virtual const TierPort* tier() const { return nullptr; }
  virtual HandoverPort* handover() { return nullptr; }
};

// The model behind the scheduler. Its hand-over port adopts into its own
// pool; claims go to the claimer a decode worker sets (none: every claim
// fails).
class PagedExecutor final : public StepExecutor, private TierPort, private HandoverPort {
 public:
  PagedExecutor(Engine& engine, const PagedEngineOptions& opts) : pe_(engine, opts) {}
  const KvManager& kv() const override { return pe_.kv(); }
  Scope kv_scope(const Scope& caller) const override { return pe_.kv_scope(caller); }
  SeqAdmission add(std::span<const int32_t> prompt, const Scope& caller, bool use_cache) override {
    return pe_.add(prompt, caller, use_cache);
  }
  SeqId fork(SeqId seq) override { return pe_.fork(seq); }
  void release(SeqId seq) override { pe_.release(seq); }
  StepResult step(const std::vector<SeqStep>& items) override { return pe_.step(items); }
  int n_vocab() const override;
  int max_ctx() const override { return pe_.max_ctx(); }
  int64_t block_bytes() const override { return int64_t(pe_.layout().block_bytes()); }
  void set_tick(int64_t tick) override { pe_.set_tick(tick); }
  int32_t drop_cached_scope(const Scope& caller) override { return pe_.drop_cached_scope(caller); }
  int32_t drop_cached_older_than(const Scope& caller, int64_t cutoff) override {
    return pe_.drop_cached_older_than(caller, cutoff);
  }
  int32_t drop_all_cached() override;
  const TierPort* tier() const override { return pe_.has_tier() ? this : nullptr; }
  HandoverPort* handover() override { return this; }

  // Where claim() looks (a decode worker's transfer endpoint). Before serving.
  using Claimer = std::function<SeqId(uint64_t, std::span<const int32_t>, const Scope&)>;
  void set_claimer(Claimer c) { claimer_ = std::move(c); }
  PagedEngine& paged() { return pe_; }
  const PagedEngine& paged() const { return pe_; }

 private:
  uint64_t prefetch(std::span<const int32_t> prompt, const Scope& caller, double retention_s) const override {
    return pe_.prefetch(prompt, caller, retention_s);
  }
  bool prefetch_pending(uint64_t ticket) const override { return pe_.prefetch_pending(ticket); }
  double prefetch_seconds(uint64_t ticket) const override { return pe_.prefetch_seconds(ticket); }
  AdoptionSlots reserve_adoption(std::span<const int32_t> prompt, const Scope& caller) override;
  void finish_adoption(SeqId seq, std::span<const int32_t> prompt) override { pe_.finish_adoption(seq, prompt); }
  SeqId claim(uint64_t handle, std::span<const int32_t> prompt, const Scope& caller) override {
    return claimer_ ? claimer_(handle, prompt, caller) : -1;
  }

  PagedEngine pe_;
  Claimer claimer_;
};

}  // namespace kvs::sched
