// Scheduling roles for the threads of a serving process, so a short task
// (an HTTP handler answering /metrics or a 429) is not kept waiting by the
// compute threads that fill every core during a long prefill.
#pragma once

namespace kvs {

// How compute threads yield to every other thread on the machine.
enum class ComputePriority {
  // SCHED_BATCH: the same CPU share as a normal thread, but it never
  // preempts others on wakeup. A woken thread (an HTTP handler, a client
  // on this machine) may still wait for the next scheduler tick.
  Batch,
  // SCHED_IDLE: any other runnable thread of the same scheduling group
  // preempts it at once, and gets the CPU while it wants it. For a machine
  // that serves and does nothing else: a CPU-bound neighbour process in the
  // same group would take nearly all of the CPU from inference.
  Idle,
};

// Process-wide: applies to compute threads marked from then on (set it
// before the engine's pool starts). Batch until set.
void set_compute_priority(ComputePriority p);
ComputePriority compute_priority();

// A compute thread, with the process's ComputePriority. The pool's helpers
// call it themselves; the engine thread that drives the pool calls it too.
// Returns false when the system refused (nothing else changes).
bool mark_compute_thread();

// A latency thread: a normal thread asking for a short time slice (Linux
// sched_setattr's sched_runtime for fair tasks, kernel 6.12 and later), so
// that on wakeup it preempts a compute thread at once instead of after the
// compute thread's slice. Returns false where the kernel does not offer it.
bool mark_latency_thread();

}  // namespace kvs
