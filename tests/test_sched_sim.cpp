// Randomised load on the scheduler with the fake engine and a fake clock:
// adversarial mixes (near-max bursts, thousands of tiny requests, one
// enormous request among small ones, a tenant flooding batch work while
// interactive requests trickle in, random cancels). After every step:
// never more blocks promised than exist minus headroom, queue bounded,
// KV bookkeeping consistent. At the end every request ended exactly once,
// completed or rejected with a reason, and greedy outputs are the fake
// model's (nothing corrupted by preemption).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>

#include "fake_executor.h"
#include "sched/scheduler.h"

using namespace kvs;
using namespace kvs::sched;

namespace {

struct Arrival {
  int prompt, max_tokens;
  SloClass cls;
  std::string tenant;
  int n = 1;
};

struct SimResult {
  int64_t accepted = 0, rejected_now = 0, completed = 0, rejected_later = 0, cancelled = 0;
  double max_interactive_ttft = 0;
  int64_t preemptions = 0;
};

class Sim {
 public:
  Sim(FakeExecutorOptions fo, SchedulerConfig sc, unsigned seed)
      : exec_(fo), sched_(exec_, sc), rng_(seed), sc_(sc) {}

  void submit(const Arrival& a) {
    Request r;
    const int salt = int(rng_() % 1000);
    for (int i = 0; i < a.prompt; ++i) r.prompt.push_back((i * 5 + salt) % 60);
    r.max_tokens = a.max_tokens;
    r.sampling.temperature = 0;
    r.slo = a.cls;
    r.tenant = a.tenant;
    r.n = a.n;
    const SubmitResult s = sched_.submit(r, now_);
    if (!s.accepted) {
      ++res_.rejected_now;
      ASSERT_NE(s.reason, RejectReason::None);
      ASSERT_FALSE(s.message.empty());
      if (retryable(s.reason)) {
        ASSERT_GE(s.retry_after_s, sc_.min_retry_after_s);
      }
      return;
    }
    res_.accepted += a.n;  // choices: each ends with one final event
    live_[s.id] = {r.prompt, a.n, a.cls, now_, -1.0, std::vector<std::vector<int32_t>>(size_t(a.n)), 0};
  }

  void step(double cancel_p = 0) {
    now_ += 0.01;
    if (cancel_p > 0 && !live_.empty() && std::uniform_real_distribution<>(0, 1)(rng_) < cancel_p) {
      auto it = live_.begin();
      std::advance(it, rng_() % live_.size());
      sched_.cancel(it->first);
    }
    std::vector<TokenEvent> ev;
    sched_.step(now_, ev);
    for (TokenEvent& e : ev) {
      auto it = live_.find(e.request);
      ASSERT_NE(it, live_.end()) << "event for a request that already ended";
      Live& L = it->second;
      if (e.token >= 0) {
        if (L.first < 0) {
          L.first = now_;
          if (L.cls == SloClass::Interactive)
            res_.max_interactive_ttft = std::max(res_.max_interactive_ttft, now_ - L.arrival);
        }
        L.out[size_t(e.choice)].push_back(e.token);
      }
      if (e.finish != FinishReason::None) {
        switch (e.finish) {
          case FinishReason::Length:
          case FinishReason::Stop: ++res_.completed; break;
          case FinishReason::Rejected:
            ASSERT_NE(e.reject_reason, RejectReason::None);
            ASSERT_GE(e.retry_after_s, 1.0);
            ++res_.rejected_later;
            break;
          case FinishReason::Cancelled: ++res_.cancelled; break;
          default: FAIL() << "unexpected finish " << to_string(e.finish);
        }
        if (e.finish == FinishReason::Length) {
          // Greedy output is the fake model's continuation (preemption and
          // recompute must not change it).
          std::vector<int32_t> ctx = L.prompt;
          for (int32_t t : L.out[size_t(e.choice)]) {
            ASSERT_EQ(t, exec_.next_token(ctx));
            ctx.push_back(t);
          }
        }
        if (++L.ended == L.n) live_.erase(it);
      }
    }
    sched_.check_invariants();  // the block promise, queue bound, bookkeeping
  }

  void run_out(int max_steps = 200000) {
    for (int i = 0; i < max_steps && sched_.has_work(); ++i) step();
    ASSERT_FALSE(sched_.has_work()) << "work left after " << max_steps << " steps";
    ASSERT_TRUE(live_.empty()) << live_.size() << " requests never ended";
    ASSERT_EQ(exec_.kv().pool().n_used(), 0);
    res_.preemptions = sched_.stats(now_).preemptions;
  }

  std::mt19937& rng() { return rng_; }
  const SimResult& result() const { return res_; }

 private:
  struct Live {
    std::vector<int32_t> prompt;
    int n;
    SloClass cls;
    double arrival, first;
    std::vector<std::vector<int32_t>> out;
    int ended;
  };
  FakeExecutor exec_;
  Scheduler sched_;
  std::mt19937 rng_;
  SchedulerConfig sc_;
  double now_ = 0;
  std::map<RequestId, Live> live_;
  SimResult res_;
};

FakeExecutorOptions fake_pool() {
  FakeExecutorOptions o;
  o.n_blocks = 512;
  o.block_size = 16;
  o.max_ctx = 4096;
  o.eos = 3;
  return o;
}

SchedulerConfig config() {
  SchedulerConfig c;
  c.max_batch_tokens = 512;
  c.max_seqs = 64;
  c.max_queue = 128;
  c.wait_limit_s = {5.0, 60.0};
  return c;
}

}  // namespace

TEST(SchedSim, NearMaxContextBursts) {
  Sim s(fake_pool(), config(), 1);
  for (int burst = 0; burst < 10; ++burst) {
    for (int i = 0; i < 40; ++i)  // 25% of 512 blocks = 128 blocks = 2048 tokens each, near the cap
      s.submit({std::uniform_int_distribution<int>(1500, 1900)(s.rng()), 100, SloClass::Interactive,
                "t" + std::to_string(i % 8)});
    for (int k = 0; k < 100; ++k) s.step();
  }
  s.run_out();
  const SimResult& r = s.result();
  EXPECT_GT(r.completed, 0);
  EXPECT_GT(r.rejected_now + r.rejected_later, 0);
  EXPECT_EQ(r.accepted, r.completed + r.rejected_later + r.cancelled);
}

TEST(SchedSim, ThousandsOfTinyRequestsAndOneEnormous) {
  Sim s(fake_pool(), config(), 2);
  s.submit({1900, 120, SloClass::Batch, "big"});
  for (int i = 0; i < 3000; ++i) {
    s.submit({std::uniform_int_distribution<int>(1, 24)(s.rng()), std::uniform_int_distribution<int>(1, 16)(s.rng()),
              i % 4 ? SloClass::Batch : SloClass::Interactive, "t" + std::to_string(i % 50)});
    if (i % 10 == 0) s.step();
  }
  s.run_out();
  const SimResult& r = s.result();
  EXPECT_EQ(r.accepted, r.completed + r.rejected_later + r.cancelled);
  EXPECT_GT(r.completed, 1000);
}

TEST(SchedSim, TenantFloodsBatchWhileInteractiveStaysFast) {
  Sim s(fake_pool(), config(), 3);
  for (int t = 0; t < 3000; ++t) {
    // Flooding tenants submit 3 batch requests every step (most are
    // rejected by its quota or the queue bound); one interactive request
    // from another tenant every 20 steps.
    for (int k = 0; k < 3; ++k)
      s.submit({std::uniform_int_distribution<int>(200, 800)(s.rng()), 200, SloClass::Batch, "flood" + std::to_string(k + t % 2)});
    if (t % 20 == 0) s.submit({std::uniform_int_distribution<int>(20, 200)(s.rng()), 32, SloClass::Interactive, "user"});
    s.step();
  }
  s.run_out();
  const SimResult& r = s.result();
  EXPECT_EQ(r.accepted, r.completed + r.rejected_later + r.cancelled);
  EXPECT_GT(r.rejected_now, 0);
  // Interactive work preempts the flood: first token within a few steps.
  EXPECT_LT(r.max_interactive_ttft, 0.5) << "interactive TTFT (fake seconds) under a batch flood";
  std::printf("flood: %lld accepted, %lld rejected at once, %lld rejected after waiting, %lld preemptions, max interactive TTFT %.2f s\n",
              (long long)r.accepted, (long long)r.rejected_now, (long long)r.rejected_later, (long long)r.preemptions,
              r.max_interactive_ttft);
}

TEST(SchedSim, RandomMixWithCancelsAndForks) {
  for (bool worst : {true, false}) {
    SchedulerConfig c = config();
    c.worst_case_reservation = worst;
    c.max_batch_tokens = 128;
    Sim s(fake_pool(), c, worst ? 4 : 5);
    for (int t = 0; t < 2000; ++t) {
      const int arrivals = std::poisson_distribution<int>(0.7)(s.rng());
      for (int k = 0; k < arrivals; ++k) {
        const bool inter = s.rng()() % 3 == 0;
        s.submit({std::uniform_int_distribution<int>(1, 600)(s.rng()), std::uniform_int_distribution<int>(1, 200)(s.rng()),
                  inter ? SloClass::Interactive : SloClass::Batch, "t" + std::to_string(s.rng()() % 5),
                  s.rng()() % 8 == 0 ? 2 + int(s.rng()() % 3) : 1});
      }
      s.step(0.02);
    }
    s.run_out();
    const SimResult& r = s.result();
    EXPECT_EQ(r.accepted, r.completed + r.rejected_later + r.cancelled);
    EXPECT_GT(r.completed, 100);
  }
}
