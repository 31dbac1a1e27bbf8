// Scheduling roles for the threads of a serving process, so a short task
// (an HTTP handler answering /metrics or a 429) is not kept waiting by the
// compute threads that fill every core during a long prefill.
#pragma once

namespace kvs {

// A compute thread (Linux SCHED_BATCH): the same CPU share as a normal
// thread, but it never preempts others on wakeup. The pool's helpers call
// it themselves; the engine thread that drives the pool calls it too.
// Returns false when the system refused (nothing else changes).
bool mark_compute_thread();

// A latency thread: a normal thread asking for a short time slice (Linux
// sched_setattr's sched_runtime for fair tasks, kernel 6.12 and later), so
// that on wakeup it preempts a compute thread at once instead of after the
// compute thread's slice. Returns false where the kernel does not offer it.
bool mark_latency_thread();

}  // namespace kvs
