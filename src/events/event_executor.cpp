#include "events/event_executor.h"

namespace kvs::events {

EventingExecutor::EventingExecutor(std::unique_ptr<sched::PagedExecutor> inner, EventPublisher& pub, bool tokens)
    : inner_(std::move(inner)), pub_(pub) {
  log_.tokens = tokens;
  inner_->paged().set_kv_event_log(&log_);
}

EventingExecutor::~EventingExecutor() { inner_->paged().set_kv_event_log(nullptr); }

void EventingExecutor::flush() {
  if (log_.events.empty()) return;
  std::vector<KvEvent> batch;
  batch.swap(log_.events);
  pub_.offer(std::move(batch), wall_seconds());
}

SeqAdmission EventingExecutor::add(std::span<const int32_t> prompt, const Scope& caller, bool use_cache) {
  const SeqAdmission a = inner_->add(prompt, caller, use_cache);
  flush();
  return a;
}

SeqId EventingExecutor::fork(SeqId seq) {
  const SeqId id = inner_->fork(seq);
  flush();
  return id;
}

void EventingExecutor::release(SeqId seq) {
  inner_->release(seq);
  flush();
}

StepResult EventingExecutor::step(const std::vector<SeqStep>& items) {
  StepResult r = inner_->step(items);
  flush();
  return r;
}

int32_t EventingExecutor::drop_cached_scope(const Scope& caller) {
  const int32_t n = inner_->drop_cached_scope(caller);
  flush();
  return n;
}

int32_t EventingExecutor::drop_all_cached() {
  const int32_t n = inner_->drop_all_cached();
  flush();
  return n;
}

int32_t EventingExecutor::drop_cached_older_than(const Scope& caller, int64_t cutoff) {
  const int32_t n = inner_->drop_cached_older_than(caller, cutoff);
  flush();
  return n;
}

sched::AdoptionSlots EventingExecutor::reserve_adoption(std::span<const int32_t> prompt, const Scope& caller) {
  sched::AdoptionSlots s = inner_->handover()->reserve_adoption(prompt, caller);
  flush();
  return s;
}

void EventingExecutor::finish_adoption(SeqId seq, std::span<const int32_t> prompt) {
  inner_->handover()->finish_adoption(seq, prompt);
  flush();
}

}  // namespace kvs::events
