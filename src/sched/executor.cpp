#include "sched/executor.h"

#include <string>

#include "model/model.h"

namespace kvs::sched {

int PagedExecutor::n_vocab() const { return const_cast<PagedEngine&>(pe_).engine().model().config().n_vocab; }

int32_t PagedExecutor::drop_all_cached() {
  const auto n = int32_t(pe_.kv().stats().cached_blocks);
  pe_.drop_cached();
  return n;
}

AdoptionSlots PagedExecutor::reserve_adoption(std::span<const int32_t> prompt, const Scope& caller) {
  AdoptionSlots r;
  KvManager::Adoption a;
  try {
    a = pe_.reserve_adoption(prompt, caller);
  } catch (const std::exception& e) {
    r.error = e.what();
    return r;
  }
  if (a.seq < 0) return r;
  r.seq = a.seq;
  r.hit_blocks = a.hit_entries;
  for (const auto& [t, i] : a.fresh) r.blocks.push_back(pe_.block(pe_.kv().block_table(a.seq, t)[size_t(i)]));
  r.residual = pe_.residual(a.seq);
  return r;
}

}  // namespace kvs::sched
