// The serving path's locks, each with its place in the one lock order
// (docs/ARCHITECTURE.md, "Threads and locks"): a thread may take a lock
// only while every lock it holds ranks lower. Builds with assertions (no
// NDEBUG: the sanitizer builds) check that on every lock() and abort with
// both names otherwise; Release builds keep a plain std::mutex.
//
//   rank 1  EngineLoop live      live requests' sinks and text state
//   rank 2  Scheduler            queues, requests, counters
//   rank 3  EngineLoop metrics   the published snapshot and pool views
//   rank 4  EngineLoop inbox     pool commands, stop flag, wake-ups (a leaf)
#pragma once
#include <cstdint>
#include <mutex>

namespace kvs::sched {

enum class LockRank : uint8_t { Live = 1, Scheduler = 2, Metrics = 3, Inbox = 4 };
const char* to_string(LockRank r);

class RankedMutex {
 public:
  explicit RankedMutex(LockRank r) : rank_(r) {}
  RankedMutex(const RankedMutex&) = delete;
  RankedMutex& operator=(const RankedMutex&) = delete;
  void lock() {
    before_lock();
    m_.lock();
    held(true);
  }
  bool try_lock() {
    if (!m_.try_lock()) return false;
    held(true);
    return true;
  }
  void unlock() {
    held(false);
    m_.unlock();
  }
  LockRank rank() const { return rank_; }

 private:
#ifdef NDEBUG
  void before_lock() const {}
  void held(bool) const {}
#else
  void before_lock() const;  // aborts when the thread holds a lock of this rank or higher
  void held(bool on) const;
#endif
  std::mutex m_;
  const LockRank rank_;
};

}  // namespace kvs::sched
