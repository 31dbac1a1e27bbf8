// Scheduler decisions with a fake engine and a fake clock: exact
// admit / queue / reject / preempt outcomes for scripted arrivals,
// Retry-After arithmetic, quotas, SLO ordering and aging, chunked prefill,
// forks, cancellation and recompute after preemption.
#include <gtest/gtest.h>

#include <map>

#include "kv/capacity.h"
#include "sched/admission.h"
#include "sched/executor.h"
#include "sched/scheduler.h"

using namespace kvs;
using namespace kvs::sched;

namespace {

struct Harness {
  FakeExecutor exec;
  Scheduler sched;
  double now = 0;
  std::map<std::pair<RequestId, int>, std::vector<int32_t>> toks;
  std::map<std::pair<RequestId, int>, TokenEvent> finals;
  std::vector<std::string> logs;

  Harness(FakeExecutorOptions fo, SchedulerConfig sc)
      : exec(fo), sched(exec, sc, {}, [this](const std::string& s) { logs.push_back(s); }) {}

  SubmitResult submit(int prompt_len, int max_tokens, SloClass cls = SloClass::Interactive, std::string tenant = "t",
                      int n = 1, int salt = 0) {
    Request r;
    for (int i = 0; i < prompt_len; ++i) r.prompt.push_back((i * 7 + salt * 13 + 1) % 60);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.slo = cls;
    r.tenant = std::move(tenant);
    r.n = n;
    return sched.submit(std::move(r), now);
  }
  StepReport step(double dt = 0.01) {
    now += dt;
    std::vector<TokenEvent> ev;
    StepReport rep = sched.step(now, ev);
    for (TokenEvent& e : ev) {
      if (e.token >= 0) toks[{e.request, e.choice}].push_back(e.token);
      if (e.finish != FinishReason::None) finals[{e.request, e.choice}] = e;
    }
    sched.check_invariants();
    return rep;
  }
  void run(int max_steps = 100000) {
    for (int i = 0; i < max_steps && sched.has_work(); ++i) step();
    ASSERT_FALSE(sched.has_work());
  }
  std::vector<int32_t>& tk(RequestId id, int c) { return toks[{id, c}]; }
  TokenEvent& fin(RequestId id, int c) { return finals[{id, c}]; }
  // What the fake model generates greedily for this prompt.
  std::vector<int32_t> expected(int prompt_len, int max_tokens, int salt = 0) {
    std::vector<int32_t> ctx;
    for (int i = 0; i < prompt_len; ++i) ctx.push_back((i * 7 + salt * 13 + 1) % 60);
    std::vector<int32_t> out;
    for (int i = 0; i < max_tokens; ++i) {
      const int32_t t = exec.next_token(ctx);
      out.push_back(t);
      ctx.push_back(t);
    }
    return out;
  }
};

FakeExecutorOptions pool(int32_t blocks, int bs = 16) {
  FakeExecutorOptions o;
  o.n_blocks = blocks;
  o.block_size = bs;
  return o;
}

}  // namespace

TEST(Admission, PoolLimitsAndFootprint) {
  SchedulerConfig c;  // 5% headroom, 10% interactive reserve, 25% share, 50% tenant
  const PoolLimits l = pool_limits(100, c);
  EXPECT_EQ(l.headroom, 5);
  EXPECT_EQ(l.interactive_reserve, 10);
  EXPECT_EQ(l.request_cap, 25);
  EXPECT_EQ(l.tenant_quota, 50);
  EXPECT_EQ(l.limit(SloClass::Interactive), 95);
  EXPECT_EQ(l.limit(SloClass::Batch), 85);
  EXPECT_EQ(request_footprint(160, 160, 1, 16), 20);
  // Forks share the 10 full prompt blocks: each adds blocks 10..19 of its own.
  EXPECT_EQ(request_footprint(160, 160, 3, 16), 20 + 2 * 10);
  EXPECT_EQ(request_footprint(170, 10, 2, 16), 12 + 2);
  c.kv_headroom = 0.6;
  EXPECT_THROW(pool_limits(100, c), std::invalid_argument);
}

TEST(Admission, DrainRateAndRetryAfter) {
  SchedulerConfig c;
  DrainRate d(5.0);
  EXPECT_EQ(d.rate(0), 0);
  EXPECT_EQ(retry_after_s(100, d.rate(0), c), c.fallback_retry_after_s);
  d.add(10, 0.0);
  d.add(10, 1.0);  // 20 blocks over the first second
  EXPECT_DOUBLE_EQ(d.rate(1.0), 20.0);
  EXPECT_EQ(retry_after_s(100, d.rate(1.0), c), 5.0);
  EXPECT_EQ(retry_after_s(101, 20.0, c), 6.0);  // rounded up
  EXPECT_EQ(retry_after_s(-3, 20.0, c), c.min_retry_after_s);
  EXPECT_EQ(retry_after_s(1000000, 1.0, c), c.max_retry_after_s);
  // Smoothing: one second at 0 blocks/s moves the rate by 1 - 2^(-1/5).
  d.add(0, 2.0);
  EXPECT_NEAR(d.rate(2.0), 20.0 * std::exp2(-1.0 / 5.0), 1e-9);
  // Idle time decays the rate as if zeros were seen.
  EXPECT_NEAR(d.rate(7.0), d.rate(2.0) / 2, 1e-9);
}

TEST(Scheduler, AdmitsUntilThePromiseIsFullThenQueues) {
  SchedulerConfig c;
  c.max_batch_tokens = 10000;
  Harness h(pool(100), c);
  for (int i = 0; i < 5; ++i) {
    const SubmitResult r = h.submit(160, 160, SloClass::Interactive, "t" + std::to_string(i), 1, i);
    ASSERT_TRUE(r.accepted);
    EXPECT_EQ(r.need_blocks, 20);
  }
  const StepReport rep = h.step();
  // 4 × 20 = 80 <= 95; a fifth would make 100 > 95 (total - headroom).
  EXPECT_EQ(rep.admitted, (std::vector<RequestId>{1, 2, 3, 4}));
  EXPECT_EQ(h.sched.stats(h.now).queued[0], 1);
  EXPECT_EQ(h.sched.promised_blocks(), 80);
  h.run();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(h.tk(RequestId(i + 1), 0), h.expected(160, 160, i)) << i;
    EXPECT_EQ(h.fin(RequestId(i + 1), 0).finish, FinishReason::Length);
    EXPECT_EQ(h.fin(RequestId(i + 1), 0).usage.completion_tokens, 160);
  }
}

TEST(Scheduler, BatchClassLeavesTheInteractiveReserve) {
  SchedulerConfig c;
  c.max_batch_tokens = 10000;
  Harness h(pool(100), c);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(h.submit(160, 160, SloClass::Batch, "t" + std::to_string(i), 1, i).accepted);
  // Batch may be promised 85: four requests of 20 (80), not five.
  EXPECT_EQ(h.step().admitted.size(), 4u);
  ASSERT_TRUE(h.submit(16, 48, SloClass::Interactive, "u").accepted);  // 4 blocks, fits in the reserve
  EXPECT_EQ(h.step().admitted, (std::vector<RequestId>{6}));
}

TEST(Scheduler, ImmediateRejectionsCarryReasons) {
  SchedulerConfig c;
  c.max_queue = 2;
  Harness h(pool(100), c);
  SubmitResult r = h.submit(400, 16);  // 26 blocks > 25 (25% of 100)
  EXPECT_FALSE(r.accepted);
  EXPECT_EQ(r.reason, RejectReason::RequestShare);
  EXPECT_FALSE(retryable(r.reason));
  EXPECT_EQ(r.retry_after_s, 0);
  EXPECT_NE(r.message.find("26"), std::string::npos);
  r = h.submit(5000, 16);
  EXPECT_EQ(r.reason, RejectReason::ContextLength);
  Request empty;
  EXPECT_EQ(h.sched.submit(empty, 0).reason, RejectReason::Invalid);
  ASSERT_TRUE(h.submit(16, 16, SloClass::Interactive, "a").accepted);
  ASSERT_TRUE(h.submit(16, 16, SloClass::Interactive, "b").accepted);
  r = h.submit(16, 16, SloClass::Interactive, "c");
  EXPECT_EQ(r.reason, RejectReason::QueueFull);
  EXPECT_GE(r.retry_after_s, c.min_retry_after_s);
  // Every rejection is logged with its estimate, never the prompt.
  ASSERT_EQ(h.logs.size(), 4u);
  EXPECT_NE(h.logs.back().find("reason=queue_full"), std::string::npos);
  EXPECT_NE(h.logs.back().find("need_blocks=2"), std::string::npos);
  EXPECT_NE(h.logs.back().find("tenant="), std::string::npos);
  EXPECT_EQ(h.logs.back().find("tenant=c "), std::string::npos);  // hashed
  EXPECT_EQ(h.sched.stats(0).rejections[size_t(RejectReason::QueueFull)], 1);
}

TEST(Scheduler, TenantQuotaCountsRunningAndQueued) {
  SchedulerConfig c;  // tenant quota 50 of 100 blocks
  Harness h(pool(100), c);
  ASSERT_TRUE(h.submit(160, 160, SloClass::Interactive, "flood", 1, 1).accepted);
  ASSERT_TRUE(h.submit(160, 160, SloClass::Interactive, "flood", 1, 2).accepted);
  const SubmitResult r = h.submit(160, 160, SloClass::Interactive, "flood", 1, 3);  // 60 > 50
  EXPECT_EQ(r.reason, RejectReason::TenantQuota);
  EXPECT_GE(r.retry_after_s, 1);
  EXPECT_TRUE(h.submit(160, 160, SloClass::Interactive, "other", 1, 4).accepted);
  h.run();
  // Quota released when the tenant's requests finished.
  EXPECT_TRUE(h.submit(160, 160, SloClass::Interactive, "flood", 1, 3).accepted);
}

TEST(Scheduler, InteractiveBeforeBatchAndBatchAges) {
  SchedulerConfig c;
  c.max_seqs = 1;
  c.batch_age_s = 30;
  Harness h(pool(100), c);
  ASSERT_TRUE(h.submit(16, 4, SloClass::Batch, "b", 1, 1).accepted);  // id 1 at t=0
  h.now = 0.5;
  ASSERT_TRUE(h.submit(16, 4, SloClass::Interactive, "i", 1, 2).accepted);  // id 2
  EXPECT_EQ(h.step().admitted, (std::vector<RequestId>{2}));
  h.run();
  // Now the batch request is old: it goes before a younger interactive one.
  Harness g(pool(100), c);
  ASSERT_TRUE(g.submit(16, 4, SloClass::Batch, "b", 1, 1).accepted);
  g.now = 40;
  ASSERT_TRUE(g.submit(16, 4, SloClass::Interactive, "i", 1, 2).accepted);
  EXPECT_EQ(g.step().admitted, (std::vector<RequestId>{1}));
}

TEST(Scheduler, InteractivePreemptsTheNewestBatchAndItResumesIdentically) {
  SchedulerConfig c;
  c.max_batch_tokens = 10000;
  c.tenant_quota_share = 1.0;
  Harness h(pool(100), c);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(h.submit(160, 160, SloClass::Batch, "b", 1, i).accepted);
  EXPECT_EQ(h.step().admitted.size(), 4u);  // 80 promised
  for (int i = 0; i < 10; ++i) h.step();
  ASSERT_TRUE(h.submit(160, 160, SloClass::Interactive, "i", 1, 9).accepted);  // 20 more: 100 > 95
  const StepReport rep = h.step();
  EXPECT_EQ(rep.preempted, (std::vector<RequestId>{4}));  // most recently admitted batch
  EXPECT_EQ(rep.admitted, (std::vector<RequestId>{5}));
  EXPECT_EQ(h.sched.stats(h.now).preemptions, 1);
  h.run();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.tk(RequestId(i + 1), 0), h.expected(160, 160, i)) << i;
  EXPECT_EQ(h.tk(RequestId(5), 0), h.expected(160, 160, 9));
}

TEST(Scheduler, QueueTimeoutRejectsWithRetryAfter) {
  SchedulerConfig c;
  c.max_batch_tokens = 10000;
  c.tenant_quota_share = 1.0;
  c.wait_limit_s = {10.0, 300.0};
  Harness h(pool(100), c);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(h.submit(160, 160, SloClass::Interactive, "a", 1, i).accepted);
  h.step();
  ASSERT_TRUE(h.submit(160, 160, SloClass::Interactive, "a", 1, 7).accepted);  // id 5 waits
  h.step(5.0);
  EXPECT_EQ(h.finals.count(std::make_pair(RequestId(5), 0)), 0u);
  h.step(6.0);  // 11 s after arrival
  ASSERT_EQ(h.finals.count(std::make_pair(RequestId(5), 0)), 1u);
  const TokenEvent& e = h.fin(5, 0);
  EXPECT_EQ(e.finish, FinishReason::Rejected);
  EXPECT_EQ(e.reject_reason, RejectReason::QueueTimeout);
  EXPECT_GE(e.retry_after_s, 1);
  EXPECT_EQ(h.sched.stats(h.now).rejections[size_t(RejectReason::QueueTimeout)], 1);
}

TEST(Scheduler, DecodesFirstThenPrefillChunks) {
  SchedulerConfig c;
  c.max_batch_tokens = 32;
  Harness h(pool(100), c);
  ASSERT_TRUE(h.submit(8, 50, SloClass::Interactive, "a", 1, 1).accepted);
  StepReport r = h.step();
  EXPECT_EQ(r.prefill_tokens, 8);
  ASSERT_TRUE(h.submit(100, 4, SloClass::Interactive, "b", 1, 2).accepted);
  r = h.step();  // one decode + 31 prompt tokens
  EXPECT_EQ(r.decode_tokens, 1);
  EXPECT_EQ(r.prefill_tokens, 31);
  r = h.step();
  EXPECT_EQ(r.decode_tokens, 1);
  EXPECT_EQ(r.prefill_tokens, 31);
  EXPECT_EQ(h.exec.step_tokens.back(), 32);
  h.run();
  EXPECT_EQ(h.tk(2, 0), h.expected(100, 4, 2));
  EXPECT_EQ(h.tk(1, 0), h.expected(8, 50, 1));
}

// A burst sharing one long prompt prefix: the second request waits while the
// first computes the shared blocks, then admits as a cache hit, so the
// prefix goes through the model once (not once per request). A request with
// a different prompt is not held back.
TEST(Scheduler, BurstWaitsForAPrefixInFlight) {
  SchedulerConfig c;
  c.max_batch_tokens = 128;
  Harness h(pool(200), c);
  auto submit_with = [&](int shared, int tail_salt) {
    Request r;
    for (int i = 0; i < shared; ++i) r.prompt.push_back((i * 7 + 1) % 60);          // the common prefix
    for (int i = 0; i < 10; ++i) r.prompt.push_back((i * 11 + tail_salt) % 60);   // a unique tail
    r.max_tokens = 3;
    r.sampling.temperature = 0;
    return h.sched.submit(std::move(r), h.now);
  };
  ASSERT_TRUE(submit_with(96, 5).accepted);   // request 1: 106 tokens, 6 full shared blocks
  ASSERT_TRUE(submit_with(96, 9).accepted);   // request 2: same 96-token prefix
  StepReport r = h.step();
  // 2 waits (22 tokens of budget stay unused): 1 is computing the shared blocks.
  EXPECT_EQ(r.admitted, std::vector<RequestId>{1});
  EXPECT_EQ(r.prefill_tokens, 106);
  EXPECT_EQ(h.sched.stats(h.now).prefix_waits, 1);
  r = h.step();  // 1 decodes; 2 admits with 96 tokens cached: only its 10-token tail runs
  EXPECT_EQ(r.admitted, std::vector<RequestId>{2});
  EXPECT_EQ(r.decode_tokens, 1);
  EXPECT_EQ(r.prefill_tokens, 10);
  EXPECT_EQ(h.sched.stats(h.now).prefix_waits, 1);
  // An unrelated prompt does not wait.
  ASSERT_TRUE(h.submit(30, 2, SloClass::Interactive, "t", 1, 3).accepted);
  ASSERT_TRUE(h.submit(40, 2, SloClass::Interactive, "t", 1, 4).accepted);
  r = h.step();
  EXPECT_EQ(r.admitted.size(), 2u);
  h.run();
  EXPECT_EQ(h.sched.stats(h.now).prefix_waits, 1);
  EXPECT_EQ(h.sched.stats(h.now).prefill_tokens, 106 + 10 + 30 + 40);
}

// Predicted waits: with a measured token rate, a request that would wait
// past its class's limit behind the prompt tokens ahead of it is rejected at
// submit (QueueTimeout, Retry-After = the estimate), not after the wait. A
// queued prompt that will be a prefix hit counts only its new tokens.
TEST(Scheduler, PredictedWaitRejectsAtOnce) {
  SchedulerConfig c;
  c.max_batch_tokens = 64;
  c.max_request_share = 1.0;
  c.tenant_quota_share = 1.0;
  c.wait_limit_s = {1.0, 2.0};
  Harness h(pool(400), c);
  ASSERT_TRUE(h.submit(1000, 4, SloClass::Interactive, "t", 1, 1).accepted);
  h.step(0.1);
  h.step(0.1);  // the first step's 64 tokens took 0.1 s: 640 tokens/s
  EXPECT_NEAR(h.sched.stats(h.now).tokens_per_s, 640.0, 1e-6);
  // 872 prompt tokens still ahead: (872 - 64) / 640 = 1.26 s > 1 s.
  SubmitResult r = h.submit(1000, 4, SloClass::Interactive, "t", 1, 2);
  ASSERT_FALSE(r.accepted);
  EXPECT_EQ(r.reason, RejectReason::QueueTimeout);
  EXPECT_DOUBLE_EQ(r.retry_after_s, 2.0);  // ceil(1.26)
  EXPECT_NE(r.message.find("busy"), std::string::npos) << r.message;
  // Batch requests may wait 2 s. The first repeats the running prompt: 992
  // of its tokens will be a prefix hit, so it adds 8 tokens to the backlog.
  const SubmitResult same = h.submit(1000, 4, SloClass::Batch, "t", 1, 1);  // (872 - 64) / 640 = 1.26 s
  EXPECT_TRUE(same.accepted);
  EXPECT_TRUE(h.submit(1000, 4, SloClass::Batch, "t", 1, 3).accepted);   // (872 + 8 - 64) / 640 = 1.28 s
  r = h.submit(1000, 4, SloClass::Batch, "t", 1, 4);                     // (872 + 8 + 1000 - 64) / 640 = 2.84 s
  EXPECT_FALSE(r.accepted);
  EXPECT_EQ(r.reason, RejectReason::QueueTimeout);
  EXPECT_DOUBLE_EQ(r.retry_after_s, 3.0);
  h.run();
  EXPECT_EQ(h.tk(1, 0), h.expected(1000, 4, 1));
  EXPECT_EQ(h.tk(same.id, 0), h.expected(1000, 4, 1));
}

// A cold burst (no rate measured yet, so every request queues): as soon as
// the first prefill steps give a rate, the queued requests that cannot be
// admitted before their limit are rejected, long before the limit passes.
TEST(Scheduler, ColdBurstRejectsQueuedOnceTheRateIsKnown) {
  SchedulerConfig c;
  c.max_batch_tokens = 64;
  c.max_request_share = 1.0;
  c.tenant_quota_share = 1.0;
  c.wait_limit_s = {1.0, 300.0};
  Harness h(pool(800), c);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(h.submit(300, 2, SloClass::Interactive, "t", 1, i).accepted);
  h.step(0.1);  // request 1 runs 64 of 300 tokens; nothing rejected yet (no rate)
  EXPECT_TRUE(h.finals.empty());
  h.step(0.1);  // 640 tokens/s measured; at t = 0.2 s (deadlines at 1 s):
  // request 2: 235 running prompt tokens ahead -> (235 - 64) / 640 = 0.27 s: in time;
  // request 3: + 300 of request 2 -> (535 - 64) / 640 = 0.74 s: in time;
  // request 4: + 300 of request 3 -> (835 - 64) / 640 = 1.20 s: too late, rejected now.
  ASSERT_EQ(h.finals.size(), 1u);
  EXPECT_EQ(h.fin(4, 0).finish, FinishReason::Rejected);
  EXPECT_EQ(h.fin(4, 0).reject_reason, RejectReason::QueueTimeout);
  EXPECT_NEAR(h.now, 0.2, 1e-9);
  h.run();
  for (RequestId id : {1, 2, 3}) EXPECT_EQ(h.tk(id, 0).size(), 2u) << id;
}

TEST(Scheduler, ForksShareThePromptAndCancelFreesBlocks) {
  SchedulerConfig c;
  Harness h(pool(100), c);
  ASSERT_TRUE(h.submit(64, 20, SloClass::Interactive, "a", 2, 3).accepted);
  h.step();
  h.step();
  // Both choices hold the 4 prompt blocks.
  const KvManager& kv = h.exec.kv();
  const auto seqs = kv.sequences();
  ASSERT_EQ(seqs.size(), 2u);
  EXPECT_EQ(kv.seq_info(seqs[0]).shared_blocks, 4);
  EXPECT_EQ(kv.block_table(seqs[0])[0], kv.block_table(seqs[1])[0]);
  ASSERT_TRUE(h.sched.cancel(1));
  h.step();
  EXPECT_TRUE(kv.sequences().empty());
  EXPECT_EQ(kv.pool().n_used(), 0);
  EXPECT_EQ(h.fin(1, 0).finish, FinishReason::Cancelled);
  EXPECT_EQ(h.fin(1, 1).finish, FinishReason::Cancelled);
  EXPECT_FALSE(h.sched.has_work());
}

TEST(Scheduler, OptimisticReservationPreemptsOnGrowthAndRecomputes) {
  SchedulerConfig c;
  c.worst_case_reservation = false;
  c.max_request_share = 1.0;
  c.tenant_quota_share = 1.0;
  c.kv_headroom = 0;
  c.interactive_reserve = 0;
  Harness h(pool(24, 8), c);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(h.submit(20, 40, SloClass::Batch, "a", 1, i).accepted);
  h.run();
  EXPECT_GT(h.sched.stats(h.now).preemptions, 0);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(h.tk(RequestId(i + 1), 0), h.expected(20, 40, i)) << i;
}
