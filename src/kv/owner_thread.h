// Which thread may change a piece of state. The KV pool's bookkeeping
// (KvManager, BlockPool) has one writer: the engine thread while serving
// (EngineLoop binds it when its thread starts), otherwise the first thread
// that changes it. Other threads hand their changes to the owner (the
// engine loop's inbox, sched/pool_command.h).
//
// Checked in builds with assertions (no NDEBUG: the sanitizer builds run
// the threaded tests with it): a change from another thread aborts with a
// message naming the call. Release builds compile the check away.
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace kvs {

class OwnerThread {
 public:
  // The calling thread owns the state from now on.
  void bind() const { id_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
#ifdef NDEBUG
  void check(const char*) const {}
#else
  void check(const char* what) const {
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id owner = id_.load(std::memory_order_relaxed);
    if (owner == std::thread::id() && id_.compare_exchange_strong(owner, me)) return;
    if (owner == me) return;
    std::fprintf(stderr, "kvserve: %s called from a thread that does not own the KV pool (its owner is the engine thread)\n",
                 what);
    std::abort();
  }
#endif

 private:
  mutable std::atomic<std::thread::id> id_{};
};

}  // namespace kvs
