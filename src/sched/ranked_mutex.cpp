#include "sched/ranked_mutex.h"

#include <cstdio>
#include <cstdlib>

namespace kvs::sched {

const char* to_string(LockRank r) {
  switch (r) {
    case LockRank::Live: return "engine loop live";
    case LockRank::Scheduler: return "scheduler";
    case LockRank::Metrics: return "engine loop metrics";
    case LockRank::Inbox: return "engine loop inbox";
  }
  return "?";
}

#ifndef NDEBUG
namespace {
// Locks this thread holds, by rank (a thread holds each rank at most once).
thread_local uint32_t held_mask = 0;
}  // namespace

void RankedMutex::before_lock() const {
  const uint32_t bit = 1u << unsigned(rank_);
  if (held_mask >= bit) {
    unsigned top = 31;
    while (!(held_mask >> top & 1u)) --top;
    std::fprintf(stderr, "kvserve: lock order violated: taking the %s lock while holding the %s lock\n",
                 to_string(rank_), to_string(LockRank(top)));
    std::abort();
  }
}

void RankedMutex::held(bool on) const {
  const uint32_t bit = 1u << unsigned(rank_);
  held_mask = on ? held_mask | bit : held_mask & ~bit;
}
#endif

}  // namespace kvs::sched
