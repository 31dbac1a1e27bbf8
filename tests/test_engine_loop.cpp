// The engine loop with real models (../shared/models): 64 concurrent greedy
// requests of mixed lengths give exactly the tokens each gives alone (any
// batch, any chunking, prefix cache on); preempted-and-recomputed requests
// give the same tokens as uninterrupted ones; cancel frees blocks at once;
// n = 2 choices share the prompt; a sink that refuses events cancels its
// request; over-share requests are rejected with a reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <nlohmann/json.hpp>
#include <thread>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "kvserve/engine.h"
#include "model/model.h"
#include "sched/engine_loop.h"
#include "sched/ranked_mutex.h"
#include "tokenizer/tokenizer.h"
#include "fake_executor.h"
#include "test_util.h"

using namespace kvs;
using namespace kvs::sched;

namespace {

struct Collected {
  std::mutex mu;
  std::map<std::pair<RequestId, int>, std::vector<int32_t>> toks;
  std::map<std::pair<RequestId, int>, std::string> text;
  std::map<std::pair<RequestId, int>, TokenEvent> finals;
  EventSink sink() {
    return [this](TokenEvent&& e) {
      std::lock_guard lk(mu);
      const auto key = std::make_pair(e.request, e.choice);
      if (e.token >= 0) toks[key].push_back(e.token);
      text[key] += e.text;
      if (e.finish != FinishReason::None) finals[key] = e;
      return true;
    };
  }
  std::vector<int32_t> tk(RequestId id, int c = 0) {
    std::lock_guard lk(mu);
    return toks[{id, c}];
  }
  FinishReason fin(RequestId id, int c = 0) {
    std::lock_guard lk(mu);
    auto it = finals.find({id, c});
    return it == finals.end() ? FinishReason::None : it->second.finish;
  }
};

struct Spec {
  std::vector<int32_t> prompt;
  int max_tokens;
};

struct Fixture {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  explicit Fixture(const std::string& rel) {
    model = Model::load(test::shared("models/" + rel));
    tok = Tokenizer::create(model->vocab());
    engine = std::make_unique<Engine>(model, EngineOptions{2});
  }
};

EngineLoopOptions loop_opts(int64_t blocks, int bs, int max_batch_tokens, int max_seqs, bool caching) {
  EngineLoopOptions o;
  o.kv_blocks = blocks;
  o.block_size = bs;
  o.max_ctx = 512;
  o.prefix_caching = caching;
  o.sched.max_batch_tokens = max_batch_tokens;
  o.sched.max_seqs = max_seqs;
  o.sched.max_request_share = 1.0;
  o.sched.tenant_quota_share = 1.0;
  o.sched.max_queue = 1000;
  o.sched.wait_limit_s = {1e6, 1e6};
  o.log = [](const std::string&) {};
  return o;
}

// Mixed lengths, some sharing a long common prefix (prefix-cache hits).
std::vector<Spec> make_specs(int n, int n_vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tokd(3, n_vocab - 1);
  std::vector<int32_t> shared_prefix(70);
  for (auto& t : shared_prefix) t = tokd(rng);
  std::vector<Spec> specs;
  for (int i = 0; i < n; ++i) {
    Spec s;
    s.prompt = {1};
    if (i % 3 == 0) s.prompt.insert(s.prompt.end(), shared_prefix.begin(), shared_prefix.end());
    const int len = std::uniform_int_distribution<int>(1, 150)(rng);
    for (int k = 0; k < len; ++k) s.prompt.push_back(tokd(rng));
    s.max_tokens = std::uniform_int_distribution<int>(1, 48)(rng);
    specs.push_back(std::move(s));
  }
  return specs;
}

Request make_request(const Spec& s, Collected& c, SloClass cls = SloClass::Interactive) {
  Request r;
  r.prompt = s.prompt;
  r.max_tokens = s.max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.slo = cls;
  r.sink = c.sink();
  return r;
}

// Each request alone: a fresh loop, one sequence, no chunking, cold cache.
std::vector<std::vector<int32_t>> alone(Fixture& f, const std::vector<Spec>& specs) {
  std::vector<std::vector<int32_t>> out;
  for (const Spec& s : specs) {
    Collected c;
    EngineLoop loop(*f.engine, f.tok.get(), loop_opts(64, 16, 4096, 1, false));
    const SubmitResult r = loop.submit(make_request(s, c));
    EXPECT_TRUE(r.accepted) << r.message;
    loop.wait_idle();
    out.push_back(c.tk(r.id));
  }
  return out;
}

}  // namespace

TEST(EngineLoop, SixtyFourConcurrentGreedyRequestsMatchEachAlone) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  for (const char* rel : {"stories260K/stories260K.gguf", "tiny-random/tiny-llama-q4_0.gguf"}) {
    Fixture f(rel);
    const auto specs = make_specs(64, f.model->config().n_vocab, 7);
    const auto ref = alone(f, specs);
    Collected c;
    // Small token budget: long prompts are chunked across steps while the
    // others decode; prefix caching on.
    EngineLoop loop(*f.engine, f.tok.get(), loop_opts(1024, 16, 96, 64, true));
    std::vector<RequestId> ids;
    for (const Spec& s : specs) {
      const SubmitResult r = loop.submit(make_request(s, c));
      ASSERT_TRUE(r.accepted) << r.message;
      ids.push_back(r.id);
    }
    loop.wait_idle();
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(c.tk(ids[i]), ref[i]) << rel << " request " << i;
      EXPECT_EQ(int(ref[i].size()), specs[i].max_tokens);
      EXPECT_EQ(c.fin(ids[i]), FinishReason::Length);
    }
    const MetricsSnapshot m = loop.metrics();
    EXPECT_GT(m.prefix_hit_tokens, 0) << "shared prefixes should hit the cache";
    EXPECT_EQ(m.kv_blocks_used, 0);
    EXPECT_EQ(m.requests_finished, 64);
    EXPECT_GT(m.generated_tokens, 0);
    EXPECT_EQ(m.ttft.count, 64u);
  }
}

TEST(EngineLoop, PreemptedAndRecomputedRequestsGiveTheSameTokens) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  Fixture f("stories260K/stories260K.gguf");
  auto specs = make_specs(12, f.model->config().n_vocab, 11);
  for (auto& s : specs) s.max_tokens = 60;
  const auto ref = alone(f, specs);
  // A pool far too small for twelve 60-token continuations, optimistic
  // reservation: growth runs out of blocks and preempts.
  EngineLoopOptions o = loop_opts(64, 8, 128, 12, true);
  o.sched.worst_case_reservation = false;
  o.sched.kv_headroom = 0;
  o.sched.interactive_reserve = 0;
  Collected c;
  EngineLoop loop(*f.engine, f.tok.get(), o);
  std::vector<RequestId> ids;
  for (const Spec& s : specs) ids.push_back(loop.submit(make_request(s, c, SloClass::Batch)).id);
  loop.wait_idle();
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(c.tk(ids[i]), ref[i]) << "request " << i;
  EXPECT_GT(loop.metrics().preemptions, 0);
}

TEST(EngineLoop, InteractiveArrivalPreemptsBatchWithIdenticalResults) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  Fixture f("stories260K/stories260K.gguf");
  auto specs = make_specs(6, f.model->config().n_vocab, 5);
  for (auto& s : specs) s.max_tokens = 48;
  const auto ref = alone(f, specs);
  EngineLoopOptions o = loop_opts(64, 16, 256, 16, true);
  o.max_ctx = 256;
  Collected c;
  EngineLoop loop(*f.engine, f.tok.get(), o);
  std::vector<RequestId> ids;
  for (size_t i = 0; i + 1 < specs.size(); ++i) ids.push_back(loop.submit(make_request(specs[i], c, SloClass::Batch)).id);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ids.push_back(loop.submit(make_request(specs.back(), c, SloClass::Interactive)).id);
  loop.wait_idle();
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(c.tk(ids[i]), ref[i]) << "request " << i;
}

TEST(EngineLoop, CancelFreesBlocksAndNTwoSharesThePrompt) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  Fixture f("stories260K/stories260K.gguf");
  const auto specs = make_specs(1, f.model->config().n_vocab, 3);
  const auto ref = alone(f, specs);
  Collected c;
  EngineLoop loop(*f.engine, f.tok.get(), loop_opts(256, 16, 512, 8, true));
  Request r = make_request(specs[0], c);
  r.n = 2;
  const SubmitResult a = loop.submit(std::move(r));
  ASSERT_TRUE(a.accepted);
  loop.wait_idle();
  // Greedy: both choices are the request alone.
  EXPECT_EQ(c.tk(a.id, 0), ref[0]);
  EXPECT_EQ(c.tk(a.id, 1), ref[0]);
  {
    std::lock_guard lk(c.mu);
    const int done_tokens = c.finals[std::make_pair(a.id, 1)].usage.completion_tokens;
    EXPECT_EQ(done_tokens, 2 * int(ref[0].size()));
  }
  // A long request cancelled mid-way: blocks back at once, final event Cancelled.
  Spec longs = specs[0];
  longs.max_tokens = 400;
  Request lr = make_request(longs, c);
  std::atomic<int> seen{0};
  EventSink inner = c.sink();
  lr.sink = [&](TokenEvent&& e) { ++seen; return inner(std::move(e)); };
  const SubmitResult b = loop.submit(std::move(lr));
  ASSERT_TRUE(b.accepted);
  while (seen < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(loop.cancel(b.id));
  loop.wait_idle();
  EXPECT_EQ(c.fin(b.id), FinishReason::Cancelled);
  EXPECT_LT(c.tk(b.id).size(), 400u);
  EXPECT_EQ(loop.metrics().kv_blocks_used, 0);
  EXPECT_FALSE(loop.cancel(b.id));
}

TEST(EngineLoop, RefusingSinkCancelsAndOverShareIsRejected) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  Fixture f("stories260K/stories260K.gguf");
  EngineLoopOptions o = loop_opts(64, 16, 512, 8, true);
  o.sched.max_request_share = 0.25;
  Collected c;
  EngineLoop loop(*f.engine, f.tok.get(), o);
  Spec s{{1, 5, 6, 7}, 100};
  std::atomic<int> calls{0};
  Request r = make_request(s, c);
  FinishReason last = FinishReason::None;
  r.sink = [&](TokenEvent&& e) {
    ++calls;
    if (e.finish != FinishReason::None) last = e.finish;
    return false;  // a full queue: the consumer cannot take anything
  };
  const SubmitResult a = loop.submit(std::move(r));
  ASSERT_TRUE(a.accepted);  // 104 tokens: 7 blocks <= 16 (25% of 64)
  loop.wait_idle();
  EXPECT_EQ(last, FinishReason::Cancelled);
  EXPECT_LE(calls.load(), 3);
  Spec big{std::vector<int32_t>(300, 5), 100};
  const SubmitResult b = loop.submit(make_request(big, c));
  EXPECT_FALSE(b.accepted);
  EXPECT_EQ(b.reason, RejectReason::RequestShare);
  EXPECT_EQ(loop.metrics().rejections[size_t(RejectReason::RequestShare)], 1);
}

// The forward runs without the scheduler's lock: while one is in progress
// (held open here by the fake executor until the test lets it go), submit,
// a 429, cancel and metrics all return. Before the three-phase step they
// waited for the whole forward, so this deadlocked until the gate opened.
TEST(EngineLoop, SubmitCancelAndMetricsNeverWaitForAForward) {
  FakeExecutorOptions fo;
  fo.n_blocks = 64;
  auto fake = std::make_unique<FakeExecutor>(fo);
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool in_forward = false, open = false;
  fake->on_step = [&] {
    std::unique_lock lk(gate_mu);
    in_forward = true;
    gate_cv.notify_all();
    gate_cv.wait(lk, [&] { return open; });
  };
  EngineLoopOptions o = loop_opts(64, 16, 512, 4, true);
  o.sched.max_queue = 0;
  EngineLoop loop(std::move(fake), nullptr, o);
  Collected c;
  Request first = make_request({{1, 2, 3, 4, 5}, 4}, c);
  ASSERT_TRUE(loop.submit(std::move(first)).accepted);
  {
    std::unique_lock lk(gate_mu);
    ASSERT_TRUE(gate_cv.wait_for(lk, std::chrono::seconds(30), [&] { return in_forward; }));
  }
  // Everything below must finish while the forward is still held open.
  auto probe = std::async(std::launch::async, [&] {
    Request more = make_request({{1, 2, 3, 4, 5, 6}, 4}, c);
    const SubmitResult a = loop.submit(std::move(more));
    Request too_many = make_request({{7, 8}, 2}, c);
    too_many.n = 100;  // over --max-seqs: a 400 at submit
    const SubmitResult b = loop.submit(std::move(too_many));
    const bool cancelled = a.accepted && loop.cancel(a.id);
    const MetricsSnapshot m = loop.metrics();
    return a.accepted && !b.accepted && cancelled && m.requests_submitted == 3;
  });
  const bool done_in_time = probe.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  {
    std::lock_guard lk(gate_mu);
    open = true;
  }
  gate_cv.notify_all();
  ASSERT_TRUE(done_in_time) << "submit/cancel/metrics waited for the forward";
  EXPECT_TRUE(probe.get());
  loop.wait_idle();
  EXPECT_EQ(c.fin(1), FinishReason::Length);
  EXPECT_EQ(c.fin(2), FinishReason::Cancelled);
}

// A forward that throws fails the requests of that step with
// FinishReason::Error (never retried forever), frees their blocks, counts
// them, and the loop keeps serving.
TEST(EngineLoop, AFailingStepFailsItsRequestsAndServingGoesOn) {
  FakeExecutorOptions fo;
  fo.n_blocks = 64;
  auto fake = std::make_unique<FakeExecutor>(fo);
  fake->fault = [](const std::vector<SeqStep>& items) {
    for (const SeqStep& it : items)
      for (int32_t t : it.tokens)
        if (t == 59) throw std::runtime_error("injected fault");
  };
  EngineLoop loop(std::move(fake), nullptr, loop_opts(64, 16, 512, 4, true));
  Collected c;
  const SubmitResult bad = loop.submit(make_request({{1, 2, 59, 3}, 4}, c));
  ASSERT_TRUE(bad.accepted);
  loop.wait_idle();
  EXPECT_EQ(c.fin(bad.id), FinishReason::Error);
  const SubmitResult good = loop.submit(make_request({{1, 2, 3}, 5}, c));
  ASSERT_TRUE(good.accepted);
  loop.wait_idle();
  EXPECT_EQ(c.fin(good.id), FinishReason::Length);
  EXPECT_EQ(c.tk(good.id).size(), 5u);
  const MetricsSnapshot m = loop.metrics();
  EXPECT_EQ(m.requests_failed, 1);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

// Device shedding through the engine loop: drop_prefix_cache turning on
// empties the prefix cache before the next step (counted in the metrics),
// and stop_admissions turns new requests away as DeviceBusy.
TEST(EngineLoop, ShedLimitsDropThePrefixCacheAndStopAdmissions) {
  FakeExecutorOptions fo;
  fo.n_blocks = 64;
  auto fake = std::make_unique<FakeExecutor>(fo);
  const FakeExecutor* ex = fake.get();
  EngineLoop loop(std::move(fake), nullptr, loop_opts(64, 16, 512, 4, true));
  Collected c;
  std::vector<int32_t> prompt(40, 5);
  ASSERT_TRUE(loop.submit(make_request({prompt, 4}, c)).accepted);
  loop.wait_idle();
  ASSERT_GT(ex->kv().stats().cached_blocks, 0);
  ShedLimits hot;
  hot.level = 2;
  hot.drop_prefix_cache = true;
  loop.set_shed_limits(hot);
  for (int i = 0; i < 500 && loop.metrics().prefix_dropped_device == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(loop.metrics().prefix_dropped_device, 2);
  EXPECT_EQ(loop.shed_limits(), hot);
  ShedLimits critical = hot;
  critical.stop_admissions = true;
  loop.set_shed_limits(critical);
  const SubmitResult r = loop.submit(make_request({prompt, 4}, c));
  EXPECT_FALSE(r.accepted);
  EXPECT_EQ(r.reason, RejectReason::DeviceBusy);
  loop.set_shed_limits({});
  EXPECT_TRUE(loop.submit(make_request({prompt, 4}, c)).accepted);
  loop.wait_idle();
}

// Other threads reach the pool only through the inbox: a command runs on the
// engine thread and is answered; a kind the executor cannot serve is
// refused with a reason, never left unanswered; after shutdown every
// command with an answer is answered at once.
TEST(EngineLoop, PoolCommandsAreAnsweredBeforeAndAfterShutdown) {
  FakeExecutorOptions fo;
  fo.n_blocks = 64;
  auto fake = std::make_unique<FakeExecutor>(fo);
  const FakeExecutor* ex = fake.get();
  EngineLoop loop(std::move(fake), nullptr, loop_opts(64, 16, 512, 4, true));
  Collected c;
  const Scope scope = make_scope("m", "tenant");
  Request r = make_request({std::vector<int32_t>(40, 5), 4}, c);
  r.scope = scope;
  ASSERT_TRUE(loop.submit(std::move(r)).accepted);
  loop.wait_idle();
  EXPECT_EQ(loop.metrics().kv_blocks_cached, 2);  // two full blocks of 16 in the prefix cache
  EXPECT_EQ(loop.drop_scope(scope), 2);
  EXPECT_EQ(loop.metrics().kv_blocks_cached, 0) << "published before the drop was answered";
  pool_cmd::ReserveAdoption ra;
  ra.prompt = {1, 2, 3};
  auto slots = ra.slots.get_future();
  loop.post(std::move(ra));
  EXPECT_EQ(slots.get().error, "this worker takes no KV hand-overs");  // the fake has no HandoverPort
  loop.shutdown();
  EXPECT_EQ(ex->kv().used_blocks(), 0);  // the caller owns the pool again: reading it is safe
  pool_cmd::DropScope d;
  d.scope = scope;
  auto freed = d.freed.get_future();
  loop.post(std::move(d));
  EXPECT_EQ(freed.get(), 0);
  pool_cmd::ReserveAdoption late;
  late.prompt = {1, 2, 3};
  auto late_slots = late.slots.get_future();
  loop.post(std::move(late));
  EXPECT_EQ(late_slots.get().error, "the server is shutting down");
  pool_cmd::FinishAdoption fin;
  auto done = fin.done.get_future();
  loop.post(std::move(fin));
  EXPECT_EQ(done.get(), "the server is shutting down");
  loop.release_held(7);  // dropped with the pool, no crash
  EXPECT_EQ(loop.drop_scope(scope), 0);
}

// The lock order (sched/ranked_mutex.h): taking a lock while holding one of
// its rank or higher aborts in builds with assertions; in order it does not.
TEST(LockOrder, OutOfOrderAbortsInOrderRuns) {
#ifdef NDEBUG
  GTEST_SKIP() << "lock-order checks are compiled into builds with assertions (scripts/sanitize.sh runs this)";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  RankedMutex live(LockRank::Live), sched(LockRank::Scheduler), metrics(LockRank::Metrics);
  {
    std::lock_guard a(live);
    std::lock_guard b(sched);
    std::lock_guard c(metrics);
  }
  {
    std::lock_guard a(live);
    std::lock_guard c(metrics);  // a rank may be skipped
  }
  EXPECT_DEATH(
      {
        std::lock_guard c(metrics);
        std::lock_guard b(sched);
      },
      "lock order violated: taking the scheduler lock while holding the engine loop metrics lock");
  EXPECT_DEATH(
      {
        std::lock_guard b(sched);
        sched.lock();  // the same lock twice would deadlock
      },
      "lock order violated");
#endif
}

// The sampling surface on the real model: a -100 logit bias means the token
// never appears; presence and frequency penalties push the greedy text
// away from the tokens it already produced.
TEST(EngineLoop, LogitBiasBansAndPenaltiesSpreadTheTokens) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  Fixture f("stories260K/stories260K.gguf");
  EngineLoop loop(*f.engine, f.tok.get(), loop_opts(128, 16, 512, 4, true));
  std::vector<int32_t> prompt = {1};
  for (int t : f.tok->encode("Once upon a time there was a little girl", false, false)) prompt.push_back(t);
  auto run = [&](const SamplingParams& sp) {
    Collected c;
    Request r = make_request({prompt, 40}, c);
    r.sampling = sp;
    r.sampling.temperature = 0;
    const SubmitResult res = loop.submit(std::move(r));
    EXPECT_TRUE(res.accepted) << res.message;
    loop.wait_idle();
    return c.tk(res.id);
  };
  const std::vector<int32_t> plain = run({});
  ASSERT_EQ(plain.size(), 40u);
  SamplingParams ban;
  for (int32_t t : plain) ban.logit_bias.push_back({t, -100.0f});
  const std::vector<int32_t> banned = run(ban);
  ASSERT_EQ(banned.size(), 40u);
  for (int32_t t : banned)
    EXPECT_EQ(std::find(plain.begin(), plain.end(), t), plain.end()) << "token " << t << " was banned";
  auto distinct = [](std::vector<int32_t> v) {
    std::sort(v.begin(), v.end());
    return std::unique(v.begin(), v.end()) - v.begin();
  };
  SamplingParams pres;
  pres.presence_penalty = 2.0f;
  const std::vector<int32_t> spread = run(pres);
  EXPECT_NE(spread, plain);
  EXPECT_GT(distinct(spread), distinct(plain));
  SamplingParams freq;
  freq.frequency_penalty = 2.0f;
  EXPECT_GT(distinct(run(freq)), distinct(plain));
}

// Prompt logprobs (echo with logprobs) are what generation itself computes:
// the logprob of each token of a greedy continuation equals, bit for bit,
// its prompt logprob when prompt + continuation is fed back, whether the
// prompt is chunked or its blocks are in the prefix cache (which such a
// request does not use).
TEST(EngineLoop, PromptLogprobsEqualTheGenerationsOwn) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  Fixture f("stories260K/stories260K.gguf");
  std::vector<int32_t> prompt = {1};
  for (int t : f.tok->encode("Once upon a time there was a little dog who liked to run", false, false)) prompt.push_back(t);
  std::vector<int32_t> gen;
  std::vector<float> gen_lp;
  {
    EngineLoop loop(*f.engine, f.tok.get(), loop_opts(128, 16, 512, 4, true));
    std::mutex mu;
    Collected unused;
    Request r = make_request({prompt, 12}, unused);  // its sink is replaced below
    r.logprobs = true;
    r.sink = [&](TokenEvent&& e) {
      std::lock_guard lk(mu);
      if (e.token >= 0) {
        gen.push_back(e.token);
        gen_lp.push_back(e.logprob->logprob);
      }
      return true;
    };
    ASSERT_TRUE(loop.submit(std::move(r)).accepted);
    loop.wait_idle();
  }
  ASSERT_EQ(gen.size(), 12u);
  std::vector<int32_t> whole = prompt;
  whole.insert(whole.end(), gen.begin(), gen.end());
  for (int budget : {512, 7}) {  // whole prompt in one step, then chunks of 7
    EngineLoop loop(*f.engine, f.tok.get(), loop_opts(128, 16, budget, 4, true));
    for (int round = 0; round < 2; ++round) {  // the second finds every block cached
      std::vector<PromptLogprob> got;
      int cached = -1;
      Collected unused;
      Request r = make_request({whole, 1}, unused);
      r.logprobs = true;
      r.top_logprobs = 3;
      r.prompt_logprobs = true;
      r.sink = [&](TokenEvent&& e) {
        if (!e.prompt_logprobs.empty()) got = e.prompt_logprobs;
        if (e.finish != FinishReason::None) cached = e.usage.cached_tokens;
        return true;
      };
      ASSERT_TRUE(loop.submit(std::move(r)).accepted);
      loop.wait_idle();
      ASSERT_EQ(got.size(), whole.size()) << "budget " << budget;
      EXPECT_EQ(cached, 0);
      EXPECT_FALSE(got[0].logprob);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].position, int(i));
        EXPECT_EQ(got[i].token, whole[i]);
      }
      for (size_t k = 0; k < gen.size(); ++k) {
        const PromptLogprob& p = got[prompt.size() + k];
        ASSERT_TRUE(p.logprob);
        EXPECT_EQ(*p.logprob, gen_lp[k]) << "budget " << budget << " round " << round << " token " << k;
        ASSERT_EQ(p.top.size(), 3u);
        EXPECT_EQ(p.top[0].token, gen[k]) << "greedy: the token was the most likely";
      }
    }
  }
}

// Constrained decoding on the real model: at temperature 1, every seed's
// text is JSON that matches the schema (the SDK test checks the same over
// HTTP); n = 2 choices each keep their own grammar state; a GBNF grammar
// ends the text as soon as it is a whole sentence.
TEST(EngineLoop, GrammarConstrainsEverySampledOutput) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  Fixture f("stories260K/stories260K.gguf");
  EngineLoop loop(*f.engine, f.tok.get(), loop_opts(256, 16, 512, 8, true));
  const auto schema = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "animal": {"enum": ["cat", "dog", "bird"]},
      "age": {"type": "integer"},
      "happy": {"type": "boolean"},
      "name": {"type": "string", "maxLength": 10},
      "friends": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}
    },
    "required": ["animal", "age", "happy", "name", "friends"], "additionalProperties": false})");
  auto g = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(grammar::json_schema_gbnf(schema)));
  std::vector<int32_t> prompt = {1};
  for (int t : f.tok->encode("Once upon a time", false, false)) prompt.push_back(t);
  int max_used = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    Collected c;
    Request r = make_request({prompt, 400}, c);
    r.sampling = SamplingParams{};
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 0, r.sampling.top_p = 1, r.sampling.min_p = 0;
    r.sampling.seed = seed;
    r.ignore_eos = false;
    r.grammar = g;
    r.n = 2;
    const SubmitResult res = loop.submit(std::move(r));
    ASSERT_TRUE(res.accepted) << res.message;
    loop.wait_idle();
    for (int ch = 0; ch < 2; ++ch) {
      ASSERT_EQ(c.fin(res.id, ch), FinishReason::Stop) << "seed " << seed << ": " << c.text[{res.id, ch}];
      max_used = std::max(max_used, int(c.tk(res.id, ch).size()));
      const std::string text = c.text[{res.id, ch}];
      nlohmann::json j;
      {
        std::string dbg;
        for (int32_t t : c.tk(res.id, ch)) dbg += std::to_string(t) + "[" + f.tok->token_bytes(t, -1) + "] ";
        ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text << "\n" << dbg;
      }
      EXPECT_TRUE(j["animal"] == "cat" || j["animal"] == "dog" || j["animal"] == "bird") << text;
      EXPECT_TRUE(j["age"].is_number_integer()) << text;
      EXPECT_TRUE(j["happy"].is_boolean()) << text;
      EXPECT_LE(j["name"].get<std::string>().size(), 10u) << text;
      EXPECT_LE(j["friends"].size(), 2u) << text;
      EXPECT_EQ(j.size(), 5u) << text;
    }
    const std::string t0 = c.text[{res.id, 0}], t1 = c.text[{res.id, 1}];
    EXPECT_NE(t0, t1) << "the two choices sampled apart";
  }
  std::printf("longest constrained output: %d tokens\n", max_used);
  // json_object bounds nothing: cut at max_tokens, each text is still a
  // prefix of valid JSON (the grammar accepts it), and a whole one on stop.
  auto obj = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(grammar::json_object_gbnf()));
  for (uint64_t seed = 0; seed < 6; ++seed) {
    Collected c;
    Request r = make_request({prompt, 60}, c);
    r.sampling = SamplingParams{};
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    r.ignore_eos = false;
    r.grammar = obj;
    const SubmitResult res = loop.submit(std::move(r));
    ASSERT_TRUE(res.accepted);
    loop.wait_idle();
    const std::string text = c.text[{res.id, 0}];
    grammar::Matcher m(std::make_shared<grammar::StackArena>(obj));
    EXPECT_TRUE(m.accept(text)) << text;
    if (c.fin(res.id) == FinishReason::Stop) EXPECT_TRUE(m.can_end()) << text;
    else EXPECT_EQ(c.fin(res.id), FinishReason::Length);
  }
  // GBNF: the text ends (stop) as soon as the grammar has a whole sentence.
  Collected c;
  Request r = make_request({prompt, 50}, c);
  r.grammar = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(R"(root ::= "The " ("cat" | "dog") ".")"));
  const SubmitResult res = loop.submit(std::move(r));
  ASSERT_TRUE(res.accepted);
  loop.wait_idle();
  const std::string said = c.text[{res.id, 0}];
  EXPECT_TRUE(said == "The cat." || said == "The dog.") << said;
  EXPECT_EQ(c.fin(res.id), FinishReason::Stop);
}

// A grammar that validates but nests too deep for the matcher (a long run
// of rules that may be empty) fails its own request and nothing else: at
// admission it is turned away as invalid; where the nesting comes after a
// first word, that choice ends with an error at that point. A request
// decoding beside them runs to its end, and the loop serves the next one.
TEST(EngineLoop, GrammarTooDeepToMatchFailsItsRequestAlone) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  Fixture f("stories260K/stories260K.gguf");
  EngineLoop loop(*f.engine, f.tok.get(), loop_opts(256, 16, 512, 8, true));
  std::string run;
  for (int i = 0; i < 3000; ++i) run += " n";
  const std::string rest = " \"x\"\nn ::= \"\" | \"y\"\n";
  auto at_start = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf("root ::=" + run + rest));
  auto later = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf("root ::= \"Once\"" + run + rest));
  std::vector<int32_t> prompt = {1};
  for (int t : f.tok->encode("Once upon a time", false, false)) prompt.push_back(t);
  Collected c;
  const SubmitResult plain = loop.submit(make_request({prompt, 40}, c));
  Request a = make_request({prompt, 20}, c);
  a.grammar = at_start;
  Request b = make_request({{1}, 20}, c);
  b.grammar = later;
  const SubmitResult ra = loop.submit(std::move(a)), rb = loop.submit(std::move(b));
  ASSERT_TRUE(plain.accepted && ra.accepted && rb.accepted);
  loop.wait_idle();
  const TokenEvent fa = c.finals[std::make_pair(ra.id, 0)], fb = c.finals[std::make_pair(rb.id, 0)];
  EXPECT_EQ(fa.finish, FinishReason::Rejected);
  EXPECT_EQ(fa.reject_reason, RejectReason::Invalid);
  EXPECT_NE(fa.message.find("nesting too deep"), std::string::npos) << fa.message;
  EXPECT_EQ(fb.finish, FinishReason::Error);
  EXPECT_NE(fb.message.find("nesting too deep"), std::string::npos) << fb.message;
  EXPECT_EQ(c.fin(plain.id), FinishReason::Length);
  EXPECT_EQ(c.tk(plain.id).size(), 40u);
  Collected c2;
  const SubmitResult next = loop.submit(make_request({prompt, 8}, c2));
  ASSERT_TRUE(next.accepted);
  loop.wait_idle();
  EXPECT_EQ(c2.fin(next.id), FinishReason::Length);
}
