// The one writer of a KV pool for tests that drive a PagedExecutor without
// an engine loop (tests/test_disagg_transfer.cpp): a thread that owns the
// pool (kv/owner_thread.h), applies the pool commands other threads post
// (sched::apply_pool_command, as the engine loop does) and runs the test's
// own calls on the pool (run()), so the test's thread never touches it.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "sched/pool_command.h"

namespace kvs::test {

class PoolOwner final : public sched::PoolInbox {
 public:
  explicit PoolOwner(sched::StepExecutor& exec) : exec_(exec), th_([this] { loop(); }) {
    run([this] { exec_.kv().bind_owner_thread(); });
  }
  ~PoolOwner() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    th_.join();
    exec_.kv().bind_owner_thread();
  }
  void post(sched::PoolCommand c) override {
    auto p = std::make_shared<sched::PoolCommand>(std::move(c));
    push([this, p] {
      if (!sched::apply_pool_command(*p, exec_)) throw std::logic_error("pool owner: command needs an engine loop");
    });
  }
  // Runs f on the owner thread and returns its result.
  template <class F>
  auto run(F f) -> std::invoke_result_t<F> {
    std::packaged_task<std::invoke_result_t<F>()> task(std::move(f));
    auto fut = task.get_future();
    auto t = std::make_shared<decltype(task)>(std::move(task));
    push([t] { (*t)(); });
    return fut.get();
  }

 private:
  void push(std::function<void()> f) {
    {
      std::lock_guard lk(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  void loop() {
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      std::function<void()> f = std::move(q_.front());
      q_.pop_front();
      lk.unlock();
      f();
      lk.lock();
    }
  }
  sched::StepExecutor& exec_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  std::thread th_;
};

}  // namespace kvs::test
