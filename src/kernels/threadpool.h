// Persistent worker pool: workers spin briefly then park on a condition
// variable. The calling thread is worker 0, so a pool of N threads uses N-1
// helpers. One parallel_for = one barrier at its end.
#pragma once
#include <cstdint>
#include <functional>

namespace kvs {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1 (caller included)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Runs fn(task, thread) for task in [0, n_tasks), tasks handed out
  // dynamically in order; returns when all are done. Not reentrant.
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& fn);
  // Runs fn(thread) once on every active thread.
  void run_on_all(const std::function<void(int thread)>& fn);
  // Thread-safe. Only threads 0 .. n-1 take tasks from the next call on (n
  // clamped to [1, size()]); the others park without spinning until raised
  // again. Device shedding uses it to cool a throttled machine.
  void set_active_threads(int n);
  int active_threads() const;

 private:
  struct Impl;
  Impl* impl_;
  int n_threads_;
};

}  // namespace kvs
