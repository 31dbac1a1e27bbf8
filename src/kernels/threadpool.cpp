// Persistent worker pool (see threadpool.h).
//
// Protocol for one call:
//   caller: publish the job, reset `join_` to (generation, open, 0 joined),
//   bump `generation` (seq_cst), wake sleepers;
//   a worker that sees the new generation JOINS the job with a CAS on `join_`
//   (only while it is open), claims task ids from `next` until exhausted,
//   then increments `finished`;
//   the caller claims tasks too, then CLOSES the job (fetch_or on join_) and
//   waits until finished == joined — the single barrier of the call.
// A worker that wakes after the close never touches the job, so a
// descheduled or parked worker (2 cores shared by many processes) never
// delays the caller: it simply runs more tasks itself. run_on_all must run on
// every thread, so there the caller waits for all joins before closing.
// Workers spin on `generation` with _mm_pause for ~kSpinNs before parking on a
// condition variable, so back-to-back kernels (decode runs ~100 matmuls per
// token) never pay a futex wake-up.
//
// Lost wake-ups: a worker increments `sleepers` and re-checks the generation
// under the mutex before waiting; the caller bumps the generation before
// reading `sleepers` (both seq_cst), and takes the mutex before notifying.
// Either the worker sees the new generation, or the caller sees the sleeper
// and its notify cannot slip in before the wait.
#include "kernels/threadpool.h"

#include "kernels/thread_role.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvs {
namespace {

// Which pool (if any) is running a task on this thread: parallel_for from
// inside a task is an error (it would deadlock the barrier).
thread_local const void* t_running_pool = nullptr;

constexpr int64_t kSpinNs = 200'000;  // ~0.2 ms of spinning before parking

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct ThreadPool::Impl {
  explicit Impl(int n) : n_threads(n) {}

  // Job description, written by the caller before the generation bump.
  const std::function<void(int64_t, int)>* task_fn = nullptr;
  const std::function<void(int)>* all_fn = nullptr;  // run_on_all mode
  int64_t n_tasks = 0;
  int n_threads;

  // Each hot atomic on its own cache line: workers hammer next_ while the
  // the caller polls finished, and sleepers spin on generation.
  alignas(64) std::atomic<int64_t> next{0};
  // join_: [63:32] low bits of the job's generation, [31] closed, [30:0] joined.
  alignas(64) std::atomic<uint64_t> join{0};
  alignas(64) std::atomic<int> finished{0};
  alignas(64) std::atomic<uint64_t> generation{0};
  alignas(64) std::atomic<int> sleepers{0};
  std::atomic<int> active{0};  // threads [0, active) take tasks
  std::atomic<bool> stop{false};
  std::atomic<bool> busy{false};  // a call is in progress (reentrancy guard)

  alignas(64) std::mutex m;
  std::condition_variable cv;
  std::mutex err_m;
  std::exception_ptr error;
  std::atomic<bool> failed{false};

  std::vector<std::thread> threads;

  void record_error() {
    std::lock_guard<std::mutex> lk(err_m);
    if (!error) error = std::current_exception();
    failed.store(true, std::memory_order_relaxed);
    // Stop handing out tasks: the call is going to throw anyway.
    next.store(n_tasks, std::memory_order_relaxed);
  }

  // Body shared by the caller (thread 0) and the workers.
  void work(int thread, const void* owner) {
    const void* prev = t_running_pool;
    t_running_pool = owner;
    try {
      if (all_fn) {
        (*all_fn)(thread);
      } else {
        for (;;) {
          const int64_t t = next.fetch_add(1, std::memory_order_relaxed);
          if (t >= n_tasks) break;
          (*task_fn)(t, thread);
        }
      }
    } catch (...) {
      record_error();
    }
    t_running_pool = prev;
  }

  static constexpr uint64_t kClosed = uint64_t(1) << 31;
  static constexpr uint64_t kCountMask = kClosed - 1;

  bool try_join(uint64_t g) {
    uint64_t st = join.load(std::memory_order_acquire);
    for (;;) {
      if ((st >> 32) != (g & 0xFFFFFFFFu) || (st & kClosed)) return false;
      if (join.compare_exchange_weak(st, st + 1, std::memory_order_acq_rel)) return true;
    }
  }

  static void backoff(int i) {
    if (i < 2048) _mm_pause();
    else std::this_thread::yield();
  }

  // Not counted in `sleepers`: callers never wake a thread that may not work;
  // set_active_threads does.
  void park_inactive(int thread) {
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] {
      return stop.load(std::memory_order_seq_cst) || thread < active.load(std::memory_order_seq_cst);
    });
  }

  void worker_main(int thread, const void* owner) {
    mark_compute_thread();
    uint64_t seen = 0;
    for (;;) {
      // Spin, then park.
      uint64_t g = generation.load(std::memory_order_acquire);
      if (g == seen && !stop.load(std::memory_order_relaxed)) {
        const int64_t t0 = now_ns();
        for (int i = 0;; ++i) {
          _mm_pause();
          g = generation.load(std::memory_order_acquire);
          if (g != seen || stop.load(std::memory_order_relaxed)) break;
          if ((i & 63) == 63 && now_ns() - t0 > kSpinNs) break;
        }
      }
      if (g == seen && !stop.load(std::memory_order_relaxed)) {
        std::unique_lock<std::mutex> lk(m);
        sleepers.fetch_add(1, std::memory_order_seq_cst);
        cv.wait(lk, [&] {
          return generation.load(std::memory_order_seq_cst) != seen ||
                 stop.load(std::memory_order_seq_cst);
        });
        sleepers.fetch_sub(1, std::memory_order_relaxed);
        g = generation.load(std::memory_order_acquire);
      }
      if (stop.load(std::memory_order_acquire)) return;
      seen = g;
      if (thread >= active.load(std::memory_order_acquire)) {
        park_inactive(thread);
        seen = generation.load(std::memory_order_acquire);
        continue;
      }
      if (try_join(g)) {
        work(thread, owner);
        finished.fetch_add(1, std::memory_order_acq_rel);
      }
    }
  }

  void run(const void* owner, const std::function<void(int64_t, int)>* tf,
           const std::function<void(int)>* af, int64_t tasks) {
    if (t_running_pool == owner)
      throw std::logic_error("ThreadPool: parallel_for called from inside one of its own tasks");
    if (busy.exchange(true, std::memory_order_acquire))
      throw std::logic_error("ThreadPool: parallel_for is not reentrant (call already in progress)");
    task_fn = tf;
    all_fn = af;
    n_tasks = tasks;
    error = nullptr;
    failed.store(false, std::memory_order_relaxed);
    next.store(0, std::memory_order_relaxed);
    finished.store(0, std::memory_order_relaxed);
    const uint64_t g = generation.load(std::memory_order_relaxed) + 1;
    join.store((g & 0xFFFFFFFFu) << 32, std::memory_order_seq_cst);
    generation.store(g, std::memory_order_seq_cst);  // publishes the job
    if (sleepers.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lk(m); }
      cv.notify_all();
    }
    work(0, owner);
    if (af) {  // every thread must run fn once: wait for all to join
      const int helpers = active.load(std::memory_order_acquire) - 1;
      for (int i = 0; int(join.load(std::memory_order_acquire) & kCountMask) < helpers; ++i)
        backoff(i);
    }
    // The barrier: close the job, then wait for the workers that joined.
    const int joined = int(join.fetch_or(kClosed, std::memory_order_acq_rel) & kCountMask);
    for (int i = 0; finished.load(std::memory_order_acquire) != joined; ++i) backoff(i);
    task_fn = nullptr;
    all_fn = nullptr;
    std::exception_ptr e = error;
    error = nullptr;
    busy.store(false, std::memory_order_release);
    if (e) std::rethrow_exception(e);
  }
};

ThreadPool::ThreadPool(int n_threads) : impl_(nullptr), n_threads_(n_threads) {
  if (n_threads < 1) throw std::invalid_argument("ThreadPool: n_threads must be >= 1");
  impl_ = new Impl(n_threads);
  impl_->active.store(n_threads);
  impl_->threads.reserve(n_threads - 1);
  for (int t = 1; t < n_threads; ++t)
    impl_->threads.emplace_back([this, t] { impl_->worker_main(t, this); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(impl_->m);
    impl_->stop.store(true, std::memory_order_seq_cst);
  }
  impl_->cv.notify_all();
  for (auto& th : impl_->threads) th.join();
  delete impl_;
}

void ThreadPool::parallel_for(int64_t n_tasks,
                              const std::function<void(int64_t task, int thread)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1 || impl_->active.load(std::memory_order_acquire) == 1) {
    // No helpers needed: run inline but keep the nesting check.
    if (t_running_pool == this)
      throw std::logic_error("ThreadPool: parallel_for called from inside one of its own tasks");
    const void* prev = t_running_pool;
    t_running_pool = this;
    try {
      for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    } catch (...) {
      t_running_pool = prev;
      throw;
    }
    t_running_pool = prev;
    return;
  }
  impl_->run(this, &fn, nullptr, n_tasks);
}

void ThreadPool::set_active_threads(int n) {
  n = std::max(1, std::min(n, n_threads_));
  {
    std::lock_guard<std::mutex> lk(impl_->m);
    impl_->active.store(n, std::memory_order_seq_cst);
  }
  impl_->cv.notify_all();
}

int ThreadPool::active_threads() const { return impl_->active.load(std::memory_order_relaxed); }

void ThreadPool::run_on_all(const std::function<void(int thread)>& fn) {
  impl_->run(this, nullptr, &fn, 0);
}

}  // namespace kvs
