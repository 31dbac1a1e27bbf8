// What the scheduler drives: a KV pool plus something that turns a batch of
// sequence chunks into logits. The real one is a PagedEngine over the model;
// tests drive the scheduler with a fake one (tests/fake_executor.h) that
// keeps real KvManager bookkeeping and makes up logits. Engine thread only,
// except kv().cached_prefix_blocks(), kv_scope(), n_vocab(), max_ctx(),
// kv().live_cap(), has_tier(), prefetch() and prefetch_pending(), which any
// thread may call (immutable or internally locked).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/paged_engine.h"
#include "kv/kv_manager.h"

namespace kvs::sched {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual const KvManager& kv() const = 0;
  // The scope as the KvManager keys blocks with (model identity folded in),
  // for prefix probes without side effects.
  virtual Scope kv_scope(const Scope& caller) const = 0;
  virtual SeqAdmission add(std::span<const int32_t> prompt, const Scope& caller) = 0;
  virtual SeqId fork(SeqId seq) = 0;
  virtual void release(SeqId seq) = 0;
  // All or nothing, as PagedEngine::step: ok == false means nothing ran.
  virtual StepResult step(const std::vector<SeqStep>& items) = 0;
  virtual int n_vocab() const = 0;
  virtual int max_ctx() const = 0;
  // Prefix-cache upkeep (engine thread, between steps). Scopes are caller
  // scopes, folded like add() does. Return the cached blocks freed.
  virtual void set_tick(int64_t tick) = 0;
  virtual int32_t drop_cached_scope(const Scope& caller) = 0;
  virtual int32_t drop_cached_older_than(const Scope& caller, int64_t cutoff) = 0;
  // Every cached block of every scope (memory pressure sheds the prefix cache).
  virtual int32_t drop_all_cached() = 0;
  // Lower KV tiers (PagedEngine::prefetch). Any thread. No tier: nothing to wait for.
  virtual bool has_tier() const { return false; }
  virtual uint64_t prefetch(std::span<const int32_t> /*prompt*/, const Scope& /*caller*/, double /*retention_s*/) const {
    return 0;
  }
  virtual bool prefetch_pending(uint64_t /*ticket*/) const { return false; }
  // Seconds a finished fetch took (< 0: unknown or still running).
  virtual double prefetch_seconds(uint64_t /*ticket*/) const { return -1; }
  // Disaggregated decode (Request::handover): the sequence a KV transfer
  // adopted under `handle`, holding exactly `prompt`'s K/V in `caller`'s
  // scope, now owned by the caller; -1 when unknown, expired or not that
  // prompt. Engine thread.
  virtual SeqId claim(uint64_t /*handle*/, std::span<const int32_t> /*prompt*/, const Scope& /*caller*/) { return -1; }
};

// The model behind the scheduler.
class PagedExecutor final : public StepExecutor {
 public:
  PagedExecutor(Engine& engine, const PagedEngineOptions& opts) : pe_(engine, opts) {}
  const KvManager& kv() const override { return pe_.kv(); }
  Scope kv_scope(const Scope& caller) const override;
  SeqAdmission add(std::span<const int32_t> prompt, const Scope& caller) override { return pe_.add(prompt, caller); }
  SeqId fork(SeqId seq) override { return pe_.fork(seq); }
  void release(SeqId seq) override { pe_.release(seq); }
  StepResult step(const std::vector<SeqStep>& items) override { return pe_.step(items); }
  int n_vocab() const override;
  int max_ctx() const override { return pe_.max_ctx(); }
  void set_tick(int64_t tick) override { pe_.set_tick(tick); }
  int32_t drop_cached_scope(const Scope& caller) override { return pe_.drop_cached_scope(caller); }
  int32_t drop_cached_older_than(const Scope& caller, int64_t cutoff) override {
    return pe_.drop_cached_older_than(caller, cutoff);
  }
  int32_t drop_all_cached() override {
    const auto n = int32_t(pe_.kv().stats().cached_blocks);
    pe_.drop_cached();
    return n;
  }
  bool has_tier() const override { return pe_.has_tier(); }
  uint64_t prefetch(std::span<const int32_t> prompt, const Scope& caller, double retention_s) const override {
    return pe_.prefetch(prompt, caller, retention_s);
  }
  bool prefetch_pending(uint64_t ticket) const override { return pe_.prefetch_pending(ticket); }
  double prefetch_seconds(uint64_t ticket) const override { return pe_.prefetch_seconds(ticket); }
  SeqId claim(uint64_t handle, std::span<const int32_t> prompt, const Scope& caller) override {
    return claimer_ ? claimer_(handle, prompt, caller) : -1;
  }
  // Where claim() looks (a decode worker's transfer endpoint). Before serving.
  using Claimer = std::function<SeqId(uint64_t, std::span<const int32_t>, const Scope&)>;
  void set_claimer(Claimer c) { claimer_ = std::move(c); }
  PagedEngine& paged() { return pe_; }

 private:
  PagedEngine pe_;
  Claimer claimer_;
};

}  // namespace kvs::sched
