// The model's executor with KV-cache events: forwards every call to the
// PagedExecutor it owns, and after each call that can change the prefix
// index (add, fork, release, step, the cache drops, an adoption) hands the
// events that call produced to the publisher as one batch. Runs on the engine thread
// like any executor; offer() never waits, so the engine never blocks on the
// sockets. Built by `kvserve serve --kv-events`.
#pragma once
#include <memory>

#include "events/event_publisher.h"
#include "sched/executor.h"

namespace kvs::events {

class EventingExecutor final : public sched::StepExecutor, private sched::HandoverPort {
 public:
  // `pub` must outlive this executor. `tokens`: send block token ids.
  EventingExecutor(std::unique_ptr<sched::PagedExecutor> inner, EventPublisher& pub, bool tokens);
  ~EventingExecutor() override;

  const KvManager& kv() const override { return inner_->kv(); }
  Scope kv_scope(const Scope& caller) const override { return inner_->kv_scope(caller); }
  SeqAdmission add(std::span<const int32_t> prompt, const Scope& caller, bool use_cache) override;
  SeqId fork(SeqId seq) override;
  void release(SeqId seq) override;
  StepResult step(const std::vector<SeqStep>& items) override;
  int n_vocab() const override { return inner_->n_vocab(); }
  int max_ctx() const override { return inner_->max_ctx(); }
  void set_tick(int64_t tick) override { inner_->set_tick(tick); }
  int32_t drop_cached_scope(const Scope& caller) override;
  int32_t drop_cached_older_than(const Scope& caller, int64_t cutoff) override;
  int32_t drop_all_cached() override;
  const sched::TierPort* tier() const override { return inner_->tier(); }
  sched::HandoverPort* handover() override { return inner_->handover() ? this : nullptr; }

 private:
  // An adopted prompt's blocks are keyed like computed ones: events too.
  sched::AdoptionSlots reserve_adoption(std::span<const int32_t> prompt, const Scope& caller) override;
  void finish_adoption(SeqId seq, std::span<const int32_t> prompt) override;
  SeqId claim(uint64_t handle, std::span<const int32_t> prompt, const Scope& caller) override {
    return inner_->handover()->claim(handle, prompt, caller);
  }
  void flush();
  std::unique_ptr<sched::PagedExecutor> inner_;
  EventPublisher& pub_;
  KvEventLog log_;
};

}  // namespace kvs::events
