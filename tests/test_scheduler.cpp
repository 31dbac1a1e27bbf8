// Scheduler decisions with a fake engine and a fake clock: exact
// admit / queue / reject / preempt outcomes for scripted arrivals,
// Retry-After arithmetic, quotas, SLO ordering and aging, chunked prefill,
// forks, cancellation and recompute after preemption.
#include <gtest/gtest.h>

#include <map>

#include "kv/capacity.h"
#include "sched/admission.h"
#include "fake_executor.h"
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

  // Most tests name the admissions of a cold scheduler's first step, so the
  // cold-start sample rule is off unless a test asks for it (`cold_rule`).
  Harness(FakeExecutorOptions fo, SchedulerConfig sc, bool cold_rule = false)
      : exec(fo), sched(exec, cold_off(sc, cold_rule), {}, [this](const std::string& s) { logs.push_back(s); }) {}
  static SchedulerConfig cold_off(SchedulerConfig sc, bool cold_rule) {
    if (!cold_rule) sc.rate_sample_tokens = 0;
    return sc;
  }

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

// `serve --max-seqs 1 --ctx 512` sizes the pool for one context (33 blocks of
// 16): the one sequence it runs may use that context, whatever the share.
TEST(Admission, ARequestMayUseOneSequencesShareOfThePool) {
  SchedulerConfig c;
  c.max_seqs = 1;
  EXPECT_EQ(pool_limits(33, c).request_cap, 33 - pool_limits(33, c).headroom);
  c.max_seqs = 2;
  EXPECT_EQ(pool_limits(100, c).request_cap, 50);
  c.max_seqs = 64;  // many sequences: the share rules
  EXPECT_EQ(pool_limits(100, c).request_cap, 25);
  c.max_seqs = 1;
  Harness h(pool(33), c);
  const SubmitResult r = h.submit(5, 200);  // 13 blocks, over 25% of 33
  EXPECT_TRUE(r.accepted) << r.message;
  h.run();
  EXPECT_EQ(h.tk(r.id, 0).size(), 200u);
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

// A hybrid cache (a full-attention table and a table of 32-token windows):
// a request's worst case is per table, each bounded by its window, summed.
// 160 + 160 tokens: the full table 20 blocks, the windowed one at most
// ceil(32/16) + 2 + ceil(64/16) = 8: 28 > the request share of 25 (with
// every layer full it would be 40; with one table of every layer, 20).
// 96 + 96 tokens: 12 + 8 = 20, so four fit under 95 and a fifth waits.
TEST(Scheduler, HybridAdmissionRefusesByThePerTableSum) {
  FakeExecutorOptions fo = pool(100);
  fo.table_windows = {0, 32};
  fo.max_step_tokens = 64;
  SchedulerConfig c;
  c.max_batch_tokens = 64;
  Harness h(fo, c);
  EXPECT_EQ(h.exec.kv().table_cap(1), 8);
  const SubmitResult big = h.submit(160, 160, SloClass::Interactive, "a");
  EXPECT_FALSE(big.accepted);
  EXPECT_EQ(big.reason, RejectReason::RequestShare);
  EXPECT_NE(big.message.find("needs up to 28 KV blocks"), std::string::npos) << big.message;
  for (int i = 0; i < 5; ++i) {
    const SubmitResult r = h.submit(96, 96, SloClass::Interactive, "t" + std::to_string(i), 1, i);
    ASSERT_TRUE(r.accepted) << r.message;
    EXPECT_EQ(r.need_blocks, 20);
  }
  // A step prefills at most 64 tokens: one admission per step, and the
  // fifth is held back by the promise, not by the step budget.
  std::vector<RequestId> admitted;
  for (int i = 0; i < 8; ++i) {
    const StepReport rep = h.step();
    admitted.insert(admitted.end(), rep.admitted.begin(), rep.admitted.end());
    EXPECT_LE(h.sched.promised_blocks(), 80);
  }
  EXPECT_EQ(admitted, (std::vector<RequestId>{1, 2, 3, 4}));
  EXPECT_EQ(h.sched.stats(h.now).queued[0], 1);
  h.run();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(h.tk(RequestId(i + 1), 0), h.expected(96, 96, i)) << i;
  h.exec.kv().check_invariants(true);
  EXPECT_EQ(h.exec.kv().pool().n_used(), 0);
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
  c.max_seqs = 1;  // between steps: 2 may wait + 1 may start
  Harness h(pool(100), c);
  // One sequence at a time may use the pool less headroom (95 of 100), not more.
  SubmitResult r = h.submit(1520, 16);  // 96 blocks
  EXPECT_FALSE(r.accepted);
  EXPECT_EQ(r.reason, RejectReason::RequestShare);
  EXPECT_FALSE(retryable(r.reason));
  EXPECT_EQ(r.retry_after_s, 0);
  EXPECT_NE(r.message.find("96"), std::string::npos);
  r = h.submit(5000, 16);
  EXPECT_EQ(r.reason, RejectReason::ContextLength);
  Request empty;
  r = h.sched.submit(empty, 0);
  EXPECT_EQ(r.reason, RejectReason::Invalid);
  EXPECT_EQ(r.param, "prompt") << "an invalid request names the field at fault";
  ASSERT_TRUE(h.submit(16, 16, SloClass::Interactive, "a").accepted);
  ASSERT_TRUE(h.submit(16, 16, SloClass::Interactive, "b").accepted);
  ASSERT_TRUE(h.submit(16, 16, SloClass::Interactive, "b").accepted);
  r = h.submit(16, 16, SloClass::Interactive, "c");
  EXPECT_EQ(r.reason, RejectReason::QueueFull);
  EXPECT_GE(r.retry_after_s, c.min_retry_after_s);
  // Every rejection is logged with its estimate, never the prompt.
  ASSERT_EQ(h.logs.size(), 4u);
  EXPECT_NE(h.logs.back().find("reason=queue_full"), std::string::npos);
  EXPECT_NE(h.logs.back().find("need_blocks=2"), std::string::npos);
  EXPECT_NE(h.logs.back().find("tenant="), std::string::npos);
  // The tenant is the caller's opaque key (the server passes its hash),
  // logged verbatim so request and reject logs name it the same way.
  EXPECT_NE(h.logs.back().find("tenant=c "), std::string::npos);
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

// Predicted waits: with a measured token rate, a request whose first token
// would come after its class's limit (times the margin) because of the
// prompt tokens ahead of it is rejected at submit (QueueTimeout), not after
// the wait. Retry-After is when the work ahead will have drained enough, and
// each client turned away is booked, so the next one is told a later time. A
// queued prompt that will be a prefix hit counts only its new tokens.
TEST(Scheduler, PredictedWaitRejectsAtOnceWithStaggeredRetryAfter) {
  SchedulerConfig c;
  c.max_batch_tokens = 64;
  c.max_request_share = 1.0;
  c.tenant_quota_share = 1.0;
  c.wait_limit_s = {1.0, 2.0};
  c.ttft_margin = 0.8;
  Harness h(pool(400), c);
  ASSERT_TRUE(h.submit(1000, 4, SloClass::Interactive, "t", 1, 1).accepted);
  h.step(0.1);
  h.step(0.1);  // the first step's 64 tokens took 0.1 s: 640 tokens/s
  EXPECT_NEAR(h.sched.stats(h.now).tokens_per_s, 640.0, 1e-6);
  // 871 prompt tokens of request 1 still ahead (its last one yields logits).
  // A batch request repeating request 1's prompt: 992 tokens will be a
  // prefix hit, 8 run: (871 + 8) / 640 = 1.37 s <= 2 x 0.8.
  const SubmitResult same = h.submit(1000, 4, SloClass::Batch, "t", 1, 1);
  EXPECT_TRUE(same.accepted);
  // Interactive, 100 new tokens: slack 0.8 - 100/640 = 0.64 s < 871/640 = 1.36 s.
  SubmitResult r = h.submit(100, 4, SloClass::Interactive, "t", 1, 2);
  ASSERT_FALSE(r.accepted);
  EXPECT_EQ(r.reason, RejectReason::QueueTimeout);
  EXPECT_DOUBLE_EQ(r.retry_after_s, 1.0);  // ceil(1.36 - 0.64 + pad 0.1 x 1 s)
  EXPECT_NE(r.message.find("busy"), std::string::npos) << r.message;
  // The next one is behind request 1 and the booked client: ceil((871 + 100) / 640 - 0.64 + 0.1) = 1.
  r = h.submit(100, 4, SloClass::Interactive, "t", 1, 3);
  EXPECT_DOUBLE_EQ(r.retry_after_s, 1.0);
  // ... and the next behind both bookings: ceil((871 + 200) / 640 - 0.64 + 0.1) = 2.
  r = h.submit(100, 4, SloClass::Interactive, "t", 1, 4);
  EXPECT_DOUBLE_EQ(r.retry_after_s, 2.0);
  h.run();
  EXPECT_EQ(h.tk(1, 0), h.expected(1000, 4, 1));
  EXPECT_EQ(h.tk(same.id, 0), h.expected(1000, 4, 1));
  // The booked clients never came back; once their bookings lapse, nothing
  // is ahead: admitted, however long its own prompt.
  h.now += 10;
  const SubmitResult alone = h.submit(1000, 2, SloClass::Interactive, "t", 1, 9);
  EXPECT_TRUE(alone.accepted);
  h.run();
}

// A running batch-class prefill is not ahead of a new interactive request:
// the interactive prompt's chunks go first in every step (plan_running), so
// at most the step under way delays it. Counting the whole batch prompt
// turned interactive requests away (429) on a worker busy with one long
// document.
TEST(Scheduler, RunningBatchPrefillIsNotAheadOfAnInteractiveRequest) {
  SchedulerConfig c;
  c.max_batch_tokens = 64;
  c.max_request_share = 1.0;
  c.tenant_quota_share = 1.0;
  c.wait_limit_s = {1.0, 2.0};
  c.ttft_margin = 0.8;
  c.batch_age_s = 1e6;
  Harness h(pool(400), c);
  const SubmitResult doc = h.submit(1000, 4, SloClass::Batch, "t", 1, 1);
  ASSERT_TRUE(doc.accepted);
  h.step(0.1);
  h.step(0.1);  // 640 tokens/s; 871 tokens of the batch prompt still to run
  // Slack 0.8 - 100/640 = 0.64 s; ahead: one step of 64 tokens, 0.1 s (the
  // whole batch prompt would be 1.36 s).
  const SubmitResult chat = h.submit(100, 4, SloClass::Interactive, "t", 1, 2);
  ASSERT_TRUE(chat.accepted) << chat.message;
  for (int i = 0; i < 3; ++i) h.step(0.1);
  EXPECT_FALSE(h.tk(chat.id, 0).empty()) << "the interactive prompt did not go first";
  EXPECT_TRUE(h.tk(doc.id, 0).empty());
  // A batch newcomer still counts the running batch prompt in full.
  const SubmitResult late = h.submit(900, 4, SloClass::Batch, "t", 1, 3);
  EXPECT_FALSE(late.accepted);
  EXPECT_EQ(late.reason, RejectReason::QueueTimeout);
  h.run();
  EXPECT_EQ(h.tk(chat.id, 0), h.expected(100, 4, 2));
  EXPECT_EQ(h.tk(doc.id, 0), h.expected(1000, 4, 1));
}

// A client that comes back after its Retry-After is recognised (same scope,
// tenant and prompt): its own booking no longer counts against it, and
// bookings of clients told to come back later do not either.
TEST(Scheduler, ReturningClientIsNotQueuedBehindItsOwnBooking) {
  SchedulerConfig c;
  c.max_batch_tokens = 64;
  c.max_request_share = 1.0;
  c.tenant_quota_share = 1.0;
  c.wait_limit_s = {1.0, 2.0};
  c.ttft_margin = 0.8;
  Harness h(pool(400), c);
  ASSERT_TRUE(h.submit(2000, 4, SloClass::Interactive, "t", 1, 1).accepted);
  h.step(0.1);
  h.step(0.1);  // 640 tokens/s; 1871 tokens still ahead
  // slack 0.8 - 400/640 = 0.175 s, pad 0.1 s; ceil(1871/640 - 0.175 + 0.1) = 3, ceil(2271/640 - 0.175 + 0.1) = 4.
  const SubmitResult a = h.submit(400, 4, SloClass::Interactive, "t", 1, 2);
  ASSERT_FALSE(a.accepted);
  EXPECT_DOUBLE_EQ(a.retry_after_s, 3.0);
  const SubmitResult b = h.submit(400, 4, SloClass::Interactive, "t", 1, 3);
  ASSERT_FALSE(b.accepted);
  EXPECT_DOUBLE_EQ(b.retry_after_s, 4.0);
  // Request 1 finishes; client a returns. Were its own booking (and b's,
  // due later) counted, it would be turned away again.
  h.run();
  const SubmitResult a2 = h.submit(400, 4, SloClass::Interactive, "t", 1, 2);
  EXPECT_TRUE(a2.accepted) << a2.message;
  // A fresh client now queues behind a (queued) and b (booked).
  const SubmitResult fresh = h.submit(400, 4, SloClass::Interactive, "t", 1, 5);
  EXPECT_FALSE(fresh.accepted);
  EXPECT_GE(fresh.retry_after_s, 1.0);
  h.run();
}

// A cold burst (no rate measured yet, so every request queues): as soon as
// the first prefill steps give a rate, the queued requests whose first token
// would come too late are rejected, long before the limit passes.
TEST(Scheduler, ColdBurstRejectsQueuedOnceTheRateIsKnown) {
  SchedulerConfig c;
  c.max_batch_tokens = 64;
  c.max_request_share = 1.0;
  c.tenant_quota_share = 1.0;
  c.wait_limit_s = {1.0, 300.0};
  c.ttft_margin = 1.0;
  Harness h(pool(800), c);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(h.submit(200, 2, SloClass::Interactive, "t", 1, i).accepted);
  h.step(0.1);  // request 1 runs 64 of 200 tokens; nothing rejected yet (no rate)
  EXPECT_TRUE(h.finals.empty());
  h.step(0.1);  // 640 tokens/s measured; at t = 0.2 s (limits at 1 s), own prefill 200/640 = 0.31 s:
  // request 2: 135 running prompt tokens ahead -> 0.2 + (135 + 200) / 640 = 0.72 s: in time;
  // request 3: + 200 of request 2 -> 0.2 + 535 / 640 = 1.04 s: too late, rejected now;
  // request 4: too.
  ASSERT_EQ(h.finals.size(), 2u);
  for (RequestId id : {3, 4}) {
    EXPECT_EQ(h.fin(id, 0).finish, FinishReason::Rejected);
    EXPECT_EQ(h.fin(id, 0).reject_reason, RejectReason::QueueTimeout);
  }
  // Back at t = 1.2 s both fit: 3 runs alone, 4 behind its 200 tokens (0.31 s + its own 0.31 s).
  EXPECT_DOUBLE_EQ(h.fin(3, 0).retry_after_s, 1.0);
  EXPECT_DOUBLE_EQ(h.fin(4, 0).retry_after_s, 1.0);
  EXPECT_NEAR(h.now, 0.2, 1e-9);
  h.run();
  for (RequestId id : {1, 2}) EXPECT_EQ(h.tk(id, 0).size(), 2u) << id;
}

// Retry-After adds a tenth of the class's limit to the time the work ahead
// drains to fit: a client told the exact instant came back to find the
// estimate a little short and was turned away again (half of them in a real
// long burst). With the pad off, the same client is told one second less.
TEST(Scheduler, RetryAfterCarriesAPadOfATenthOfTheLimit) {
  for (const double share : {0.1, 0.0}) {
    SchedulerConfig c;
    c.max_batch_tokens = 64;
    c.max_request_share = 1.0;
    c.tenant_quota_share = 1.0;
    c.wait_limit_s = {10.0, 300.0};
    c.ttft_margin = 0.8;
    c.retry_pad_share = share;
    FakeExecutorOptions o = pool(800);
    o.max_ctx = 8192;
    Harness h(o, c);
    ASSERT_TRUE(h.submit(6000, 2, SloClass::Interactive, "t", 1, 1).accepted);
    h.step(0.1);
    h.step(0.1);  // 640 tokens/s; 5871 prompt tokens still ahead
    // slack 8 - 100/640 = 7.84 s; 5871/640 - 7.84 = 1.33 s; + 1 s of pad.
    const SubmitResult r = h.submit(100, 4, SloClass::Interactive, "t", 1, 2);
    ASSERT_FALSE(r.accepted);
    EXPECT_EQ(r.reason, RejectReason::QueueTimeout);
    EXPECT_DOUBLE_EQ(r.retry_after_s, share > 0 ? 3.0 : 2.0) << "pad share " << share;
  }
}

// Cold start (no prefill rate yet): a step admits prompts only until it
// holds enough prefill tokens to measure a rate, then the next step predicts.
// Admitting the whole burst on a guess gave a real cold burst first tokens
// past the class limit.
TEST(Scheduler, ColdStartAdmitsOneRateSampleBeforeItPredicts) {
  SchedulerConfig c;
  c.max_batch_tokens = 512;
  c.max_request_share = 1.0;
  c.tenant_quota_share = 1.0;
  c.wait_limit_s = {1.0, 300.0};
  c.ttft_margin = 1.0;
  c.rate_sample_tokens = 64;
  Harness h(pool(800), c, /*cold_rule=*/true);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(h.submit(200, 2, SloClass::Interactive, "t", 1, i).accepted);
  EXPECT_EQ(h.step(0.1).admitted, (std::vector<RequestId>{1}));  // 200 >= 64: enough for a rate
  // 200 tokens / 0.25 s = 800 tokens/s. At t = 0.35 s: request 2 has nothing
  // ahead; request 3 has 200 tokens (0.25 s) ahead, slack 1 - 0.25 - 0.35 =
  // 0.4 s: in time; request 4 has 400 (0.5 s): too late, rejected now.
  EXPECT_EQ(h.step(0.25).admitted, (std::vector<RequestId>{2, 3}));
  EXPECT_NEAR(h.sched.stats(h.now).tokens_per_s, 800.0, 1e-6);
  ASSERT_EQ(h.finals.count({RequestId(4), 0}), 1u);
  EXPECT_EQ(h.fin(4, 0).reject_reason, RejectReason::QueueTimeout);
  EXPECT_EQ(h.sched.stats(h.now).rejections[size_t(RejectReason::QueueTimeout)], 1);
  h.run();
  for (RequestId id : {1, 2, 3}) EXPECT_EQ(h.tk(id, 0), h.expected(200, 2, int(id) - 1)) << id;
  // Short prompts are admitted together until their sum reaches the sample.
  Harness s(pool(800), c, true);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.submit(30, 2, SloClass::Interactive, "t", 1, i).accepted);
  EXPECT_EQ(s.step(0.1).admitted, (std::vector<RequestId>{1, 2, 3}));  // 30, 60, then 90 >= 64
  s.run();
}

// --max-queue 0: no waiting. On an idle engine a request is admitted at the
// next step; when it cannot be, it is turned away at that step (429
// queue_full), never left queued and never refused while the engine is idle.
TEST(Scheduler, MaxQueueZeroAdmitsNowOrRejects) {
  SchedulerConfig c;
  c.max_queue = 0;
  c.max_seqs = 1;
  Harness h(pool(100), c);
  const SubmitResult a = h.submit(16, 4, SloClass::Interactive, "a");
  ASSERT_TRUE(a.accepted) << a.message;
  // The next step can start one sequence, and a takes it: no room to wait.
  const SubmitResult b = h.submit(16, 4, SloClass::Interactive, "b", 1, 1);
  ASSERT_FALSE(b.accepted);
  EXPECT_EQ(b.reason, RejectReason::QueueFull);
  EXPECT_GE(b.retry_after_s, c.min_retry_after_s);
  EXPECT_EQ(h.step().admitted.size(), 1u);
  h.run();
  EXPECT_EQ(h.tk(a.id, 0), h.expected(16, 4));
  // Idle again: accepted and admitted at once.
  const SubmitResult d = h.submit(16, 4, SloClass::Interactive, "d", 1, 2);
  ASSERT_TRUE(d.accepted);
  EXPECT_EQ(h.step().admitted.size(), 1u);
  h.run();
}

// The forward runs without the scheduler's lock: a fault inside it fails
// exactly the requests of that step (FinishReason::Error, their blocks
// freed), and the next request is served.
TEST(Scheduler, AFailingForwardFailsOnlyItsStep) {
  SchedulerConfig c;
  Harness h(pool(100), c);
  h.exec.fault = [](const std::vector<SeqStep>& items) {
    for (const SeqStep& it : items)
      for (int32_t t : it.tokens)
        if (t == 59) throw std::runtime_error("injected fault");
  };
  Request bad;
  bad.prompt = {1, 2, 59, 3};
  bad.max_tokens = 4;
  const SubmitResult rb = h.sched.submit(bad, h.now);
  ASSERT_TRUE(rb.accepted);
  h.step();
  ASSERT_EQ(h.fin(rb.id, 0).finish, FinishReason::Error);
  EXPECT_NE(h.fin(rb.id, 0).message.find("injected fault"), std::string::npos);
  EXPECT_EQ(h.exec.kv().used_blocks(), 0);
  EXPECT_EQ(h.sched.stats(h.now).failed, 1);
  const SubmitResult ok = h.submit(20, 3);
  ASSERT_TRUE(ok.accepted);
  h.run();
  EXPECT_EQ(h.tk(ok.id, 0), h.expected(20, 3));
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

// Running out of blocks is a result of execute(), handled by update(): the
// victim is preempted and the same step plans again and runs, so no step
// that had work ends without a forward.
TEST(Scheduler, NoRoomPreemptsAndTheSameStepRunsAgain) {
  SchedulerConfig c;
  c.worst_case_reservation = false;
  c.max_request_share = 1.0;
  c.tenant_quota_share = 1.0;
  c.kv_headroom = 0;
  c.interactive_reserve = 0;
  Harness h(pool(24, 8), c);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(h.submit(20, 40, SloClass::Batch, "a", 1, i).accepted);
  int preempting_steps = 0;
  for (int s = 0; s < 2000 && h.sched.has_work(); ++s) {
    const size_t before = h.exec.step_seqs.size();
    const StepReport r = h.step();
    if (r.preempted.empty()) continue;
    ++preempting_steps;
    EXPECT_GT(r.seqs, 0) << "step " << s << " preempted and ran nothing";
    EXPECT_EQ(h.exec.step_seqs.size(), before + 1) << "one forward per step";
    for (RequestId v : r.preempted)
      EXPECT_TRUE(std::find(r.admitted.begin(), r.admitted.end(), v) == r.admitted.end())
          << "a victim is not re-admitted in the step that preempted it";
    h.sched.check_invariants();
  }
  EXPECT_GT(preempting_steps, 0);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(h.tk(RequestId(i + 1), 0), h.expected(20, 40, i)) << i;
}

// Device shedding (shed_limits.h): new requests get a shorter max_tokens, the
// step's token budget and new admissions shrink, and at the critical level
// submit() answers DeviceBusy (HTTP 429, retryable). Running requests keep
// their promise; lifting the limits restores everything.
TEST(Scheduler, ShedLimitsShortenBatchAndStopAdmissions) {
  SchedulerConfig c;
  c.max_batch_tokens = 32;
  c.max_seqs = 4;
  ShedLimits warm;
  warm.max_tokens_scale = 0.25;
  warm.batch_scale = 0.5;
  {
    Harness h(pool(200), c);
    h.sched.set_shed(warm);
    const SubmitResult a = h.submit(100, 40, SloClass::Interactive, "a", 1, 1);
    ASSERT_TRUE(a.accepted);
    EXPECT_EQ(h.step().prefill_tokens, 16);  // half the token budget
    h.run();
    EXPECT_EQ(h.tk(a.id, 0), h.expected(100, 10, 1));  // a quarter of max_tokens
  }
  {
    // Two new sequences at most (half of four) while shedding.
    Harness h(pool(200), c);
    h.sched.set_shed(warm);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.submit(4, 8, SloClass::Interactive, "b", 1, 2 + i).accepted);
    h.step();
    EXPECT_EQ(h.sched.stats(h.now).running_seqs, 2);
    ShedLimits critical = warm;
    critical.stop_admissions = true;
    critical.retry_after_s = 12;
    h.sched.set_shed(critical);
    const SubmitResult busy = h.submit(4, 8, SloClass::Interactive, "d", 1, 9);
    EXPECT_FALSE(busy.accepted);
    EXPECT_EQ(busy.retry_after_s, 12);
    EXPECT_EQ(busy.reason, RejectReason::DeviceBusy);
    EXPECT_TRUE(retryable(busy.reason));
    EXPECT_STREQ(to_string(busy.reason), "device_busy");
    h.sched.set_shed({});
    const SubmitResult e = h.submit(4, 8, SloClass::Interactive, "e", 1, 10);
    ASSERT_TRUE(e.accepted);
    h.run();
    EXPECT_EQ(h.tk(e.id, 0), h.expected(4, 8, 10));  // after the limits were lifted
  }
}

// min_tokens bans the end-of-generation ids (and stop_token_ids) until a
// choice has that many tokens; a stop_token_id ends a choice like EOS (the
// token is not emitted), and ignore_eos does not lift it.
TEST(Scheduler, MinTokensAndStopTokenIds) {
  FakeExecutor ex(pool(64));
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back((i * 7 + 1) % 60);
  const int32_t first = ex.next_token(prompt);  // the fake's greedy first token
  Scheduler s(ex, SchedulerConfig{}, [&](int32_t t) { return t == first; });
  auto run = [&](Request r) {
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.max_tokens = 8;
    const SubmitResult sr = s.submit(std::move(r), 0);
    EXPECT_TRUE(sr.accepted) << sr.message;
    std::vector<int32_t> toks;
    FinishReason fin = FinishReason::None;
    for (int i = 0; i < 100 && s.has_work(); ++i) {
      std::vector<TokenEvent> ev;
      s.step(0.01 * i, ev);
      for (const TokenEvent& e : ev) {
        if (e.token >= 0) toks.push_back(e.token);
        if (e.finish != FinishReason::None) fin = e.finish;
      }
    }
    return std::make_pair(toks, fin);
  };
  auto [plain, f0] = run(Request{});
  EXPECT_TRUE(plain.empty());  // the first greedy token is end of generation
  EXPECT_EQ(f0, FinishReason::Stop);
  Request m;
  m.min_tokens = 3;
  auto [held, f1] = run(m);
  ASSERT_GE(held.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(held[i], first) << "end of generation drawn at token " << i;
  Request ign;
  ign.ignore_eos = true;
  ign.stop_token_ids = {first};
  auto [stopped, f2] = run(ign);
  EXPECT_TRUE(stopped.empty());
  EXPECT_EQ(f2, FinishReason::Stop);
  Request bad;
  bad.stop_token_ids = {999};
  bad.prompt = prompt;
  const SubmitResult bad_stop = s.submit(bad, 0);
  EXPECT_EQ(bad_stop.reason, RejectReason::Invalid);
  EXPECT_EQ(bad_stop.param, "stop_token_ids");
  Request too_many;
  too_many.prompt = prompt;
  too_many.max_tokens = 2;
  too_many.min_tokens = 3;
  const SubmitResult too = s.submit(too_many, 0);
  EXPECT_NE(too.message.find("exceeds max_tokens"), std::string::npos);
  EXPECT_EQ(too.param, "min_tokens");
}
