// ThreadPool: correctness of task hand-out, the single barrier, exception
// propagation, nesting errors and many quick calls (lost wake-ups).
#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/thread_role.h"
#include "kernels/threadpool.h"

namespace kvs {
namespace {

TEST(ThreadPool, SumsOverManyTasks) {
  for (int threads = 1; threads <= 4; ++threads) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t tasks : {1, 2, 3, 7, 100, 10000}) {
      std::vector<int> hits(size_t(tasks), 0);
      std::atomic<int64_t> sum{0};
      pool.parallel_for(tasks, [&](int64_t t, int th) {
        ASSERT_GE(th, 0);
        ASSERT_LT(th, threads);
        hits[size_t(t)] += 1;
        sum.fetch_add(t, std::memory_order_relaxed);
      });
      EXPECT_EQ(sum.load(), tasks * (tasks - 1) / 2);
      for (int h : hits) ASSERT_EQ(h, 1);
    }
  }
}

TEST(ThreadPool, RunOnAllVisitsEveryThreadOnce) {
  for (int threads = 1; threads <= 4; ++threads) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> seen(static_cast<size_t>(threads));
    for (auto& s : seen) s = 0;
    pool.run_on_all([&](int th) { seen[size_t(th)].fetch_add(1); });
    for (auto& s : seen) EXPECT_EQ(s.load(), 1);
  }
}

TEST(ThreadPool, UsesHelpers) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> per(3);
  for (auto& p : per) p = 0;
  // Slow tasks so every thread gets some.
  pool.parallel_for(60, [&](int64_t, int th) {
    per[size_t(th)].fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
  int total = 0, active = 0;
  for (auto& p : per) {
    total += p.load();
    active += p.load() > 0;
  }
  EXPECT_EQ(total, 60);
  EXPECT_GE(active, 2);
}

TEST(ThreadPool, ExceptionsPropagateAndPoolSurvives) {
  for (int threads = 1; threads <= 4; ++threads) {
    ThreadPool pool(threads);
    EXPECT_THROW(pool.parallel_for(100,
                                   [&](int64_t t, int) {
                                     if (t == 37) throw std::runtime_error("boom");
                                   }),
                 std::runtime_error);
    EXPECT_THROW(pool.run_on_all([&](int th) {
                   if (th == threads - 1) throw std::out_of_range("x");
                 }),
                 std::out_of_range);
    std::atomic<int> n{0};
    pool.parallel_for(50, [&](int64_t, int) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 50);
  }
}

TEST(ThreadPool, NestedUseIsAnError) {
  for (int threads = 1; threads <= 3; ++threads) {
    ThreadPool pool(threads);
    EXPECT_THROW(pool.parallel_for(4,
                                   [&](int64_t, int) {
                                     pool.parallel_for(2, [](int64_t, int) {});
                                   }),
                 std::logic_error);
    // A different pool inside a task is fine.
    ThreadPool inner(2);
    std::atomic<int> n{0};
    pool.parallel_for(3, [&](int64_t t, int) {
      if (t == 0) inner.parallel_for(5, [&](int64_t, int) { n.fetch_add(1); });
    });
    EXPECT_EQ(n.load(), 5);
  }
}

TEST(ThreadPool, ManyQuickCallsNoDeadlock) {
  for (int threads = 2; threads <= 4; ++threads) {
    ThreadPool pool(threads);
    int64_t total = 0;
    std::atomic<int64_t> acc{0};
    const int calls = threads == 2 ? 100000 : 20000;
    for (int c = 0; c < calls; ++c) {
      const int64_t tasks = 1 + c % 5;
      pool.parallel_for(tasks, [&](int64_t t, int) { acc.fetch_add(t + 1, std::memory_order_relaxed); });
      total += tasks * (tasks + 1) / 2;
    }
    EXPECT_EQ(acc.load(), total);
  }
}

TEST(ThreadPool, WakesAfterParking) {
  ThreadPool pool(3);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // longer than the spin
    std::atomic<int> n{0};
    pool.parallel_for(30, [&](int64_t, int) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 30);
  }
}

// Device shedding lowers the threads that take tasks; raising them again
// brings the parked helpers back.
TEST(ThreadPool, ActiveThreadsLimitWhoTakesTasks) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.active_threads(), 4);
  pool.set_active_threads(2);
  EXPECT_EQ(pool.active_threads(), 2);
  for (int call = 0; call < 20; ++call) {
    std::atomic<int> bad{0}, done{0};
    pool.parallel_for(40, [&](int64_t, int th) {
      if (th >= 2) bad.fetch_add(1);
      done.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    });
    ASSERT_EQ(bad.load(), 0);
    ASSERT_EQ(done.load(), 40);
  }
  std::vector<std::atomic<int>> seen(4);
  for (auto& s : seen) s = 0;
  pool.run_on_all([&](int th) { seen[size_t(th)].fetch_add(1); });
  EXPECT_EQ(seen[0].load() + seen[1].load(), 2);
  EXPECT_EQ(seen[2].load() + seen[3].load(), 0);
  pool.set_active_threads(0);  // clamped
  EXPECT_EQ(pool.active_threads(), 1);
  pool.set_active_threads(99);
  EXPECT_EQ(pool.active_threads(), 4);
  std::vector<std::atomic<int>> per(4);
  for (auto& p : per) p = 0;
  pool.parallel_for(200, [&](int64_t, int th) {
    per[size_t(th)].fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  int total = 0, used = 0;
  for (auto& p : per) {
    total += p.load();
    used += p.load() > 0;
  }
  EXPECT_EQ(total, 200);
  EXPECT_GE(used, 2);
}

TEST(ThreadPool, RejectsZeroThreads) { EXPECT_THROW(ThreadPool(0), std::invalid_argument); }

// The helpers run as compute threads (SCHED_BATCH), so a waking HTTP thread
// preempts them; the calling thread keeps its own policy until it asks.
TEST(ThreadPool, HelpersAreComputeThreads) {
  ThreadPool pool(3);
  std::atomic<int> batch{0}, other{0};
  const int caller_policy = sched_getscheduler(0);
  pool.run_on_all([&](int t) {
    if (t == 0) return;
    (sched_getscheduler(0) == SCHED_BATCH ? batch : other).fetch_add(1);
  });
  EXPECT_EQ(batch.load(), 2);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(sched_getscheduler(0), caller_policy);
  std::thread([] {
    EXPECT_TRUE(mark_compute_thread());
    EXPECT_EQ(sched_getscheduler(0), SCHED_BATCH);
  }).join();
}

// serve --compute-priority idle: the pool's helpers (and any thread marked
// from then on) run SCHED_IDLE, so a woken HTTP thread preempts them at once.
TEST(ThreadPool, IdleComputePriorityAppliesToNewHelpers) {
  set_compute_priority(ComputePriority::Idle);
  {
    ThreadPool pool(3);
    std::atomic<int> idle{0};
    pool.run_on_all([&](int t) {
      if (t > 0 && sched_getscheduler(0) == SCHED_IDLE) idle.fetch_add(1);
    });
    EXPECT_EQ(idle.load(), 2);
  }
  set_compute_priority(ComputePriority::Batch);
  ThreadPool pool(2);
  std::atomic<int> batch{0};
  pool.run_on_all([&](int t) {
    if (t > 0 && sched_getscheduler(0) == SCHED_BATCH) batch.fetch_add(1);
  });
  EXPECT_EQ(batch.load(), 1);
}

}  // namespace
}  // namespace kvs
