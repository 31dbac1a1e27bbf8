#include "kernels/thread_role.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace kvs {
namespace {
std::atomic<ComputePriority> g_priority{ComputePriority::Batch};
}

void set_compute_priority(ComputePriority p) { g_priority.store(p); }
ComputePriority compute_priority() { return g_priority.load(); }

bool mark_compute_thread() {
#if defined(SCHED_BATCH) && defined(SCHED_IDLE)
  sched_param p{};
  p.sched_priority = 0;
  const int policy = compute_priority() == ComputePriority::Idle ? SCHED_IDLE : SCHED_BATCH;
  return sched_setscheduler(0, policy, &p) == 0;  // 0: the calling thread
#else
  return false;
#endif
}

bool mark_latency_thread() {
#if defined(__linux__) && defined(SYS_sched_setattr)
  // The kernel's struct sched_attr (linux/sched/types.h), first version.
  struct Attr {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
  } a{};
  a.size = sizeof a;
  a.policy = SCHED_OTHER;
  a.runtime = 100 * 1000;  // the slice in ns: the shortest the kernel accepts
  return syscall(SYS_sched_setattr, 0, &a, 0) == 0;
#else
  return false;
#endif
}

}  // namespace kvs
