// A request handed from a prefill engine loop to a decode engine loop over
// UCX loopback (stories260K, one process): the prefill loop stops at the
// first token and ships the sequence (PrefillRole), the decode loop's
// scheduler claims it and continues (DecodeRole). Tokens equal one loop
// doing both, greedy and seeded at temperature > 0, for f32/f16/int8; every
// block goes back on both sides; a full decode pool and an unknown handle
// fail cleanly.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "disagg/decode_role.h"
#include "disagg/prefill_role.h"
#include "model/model.h"
#include "sched/engine_loop.h"
#include "test_util.h"

using namespace kvs;
using namespace kvs::sched;

namespace {

// Collects one request's events; get() waits (bounded) for its final one.
struct Events {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<TokenEvent> ev;
  bool done = false;
  EventSink sink() {
    return [this](TokenEvent&& e) {
      std::lock_guard lk(mu);
      done = done || e.finish != FinishReason::None;
      ev.push_back(std::move(e));
      cv.notify_all();
      return true;
    };
  }
  const TokenEvent& last() {
    std::unique_lock lk(mu);
    EXPECT_TRUE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return done; }));
    return ev.back();
  }
  std::vector<int32_t> tokens() {
    last();
    std::vector<int32_t> t;
    for (const TokenEvent& e : ev)
      if (e.token >= 0) t.push_back(e.token);
    return t;
  }
};

std::vector<int32_t> prompt_of(int n, int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(int32_t(3 + (i * 37 + seed * 11) % 400));
  return p;
}

Request request(const std::vector<int32_t>& prompt, float temperature, int max_tokens) {
  Request r;
  r.prompt = prompt;
  r.sampling.temperature = temperature;
  r.sampling.seed = 1234;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.scope = make_scope("test", "tenant");
  return r;
}

struct PD {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Engine> engine;
  EngineLoopOptions o;
  PagedExecutor *pre_exec = nullptr, *dec_exec = nullptr;
  std::unique_ptr<EngineLoop> both, pre, dec;
  std::unique_ptr<disagg::DecodeRole> dec_role;
  std::unique_ptr<disagg::PrefillRole> pre_role;

  PD(KvType type, int64_t dec_blocks = 64) {
    model = Model::load(test::shared("models/stories260K/stories260K.gguf"));
    engine = std::make_unique<Engine>(model, EngineOptions{1});
    o.block_size = 16;
    o.kv_blocks = 64;
    o.max_ctx = 256;
    o.cache.type = type;
    // Small pools: no share or headroom rule in the way of the cases below.
    o.sched.max_request_share = 1;
    o.sched.tenant_quota_share = 1;
    o.sched.kv_headroom = 0;
    o.log = [](const std::string&) {};
    both = std::make_unique<EngineLoop>(*engine, nullptr, o);
    EngineLoopOptions po = o, dopt = o;
    dopt.kv_blocks = dec_blocks;
    auto pe = paged_executor(*engine, po);
    auto de = paged_executor(*engine, dopt);
    pre_exec = pe.get();
    dec_exec = de.get();
    pre = std::make_unique<EngineLoop>(std::move(pe), nullptr, po);
    dec = std::make_unique<EngineLoop>(std::move(de), nullptr, dopt);
    // Transfers adopt through the decode loop's inbox.
    dec_role = std::make_unique<disagg::DecodeRole>(*dec_exec, *dec, disagg::DecodeOptions{}, o.log);
    pre_role = std::make_unique<disagg::PrefillRole>(
        *pre_exec, *pre, std::vector<disagg::PrefillOptions>{{"127.0.0.1", dec_role->port()}}, o.log);
  }
  ~PD() {
    pre->shutdown();
    dec->shutdown();
    pre_role.reset();
  }
  // Prefill on `pre` and ship: the prefill side's final event.
  TokenEvent prefill(Request r) {
    Events pe;
    r.hand_off = true;
    r.sink = pre_role->wrap(pe.sink(), r.scope);
    EXPECT_TRUE(pre->submit(std::move(r)).accepted);
    return pe.last();
  }
  // Continue on `dec` what `h` handed over: its tokens, the first included.
  std::vector<int32_t> decode(Request r, const TokenEvent& h) {
    Events de;
    r.handover = Handover{h.hand_off->handle, h.hand_off->first_token, h.hand_off->draws};
    r.sink = de.sink();
    EXPECT_TRUE(dec->submit(std::move(r)).accepted);
    return de.tokens();
  }
  std::pair<std::vector<int32_t>, TokenEvent> run(const Request& r) {
    const TokenEvent h = prefill(r);
    if (h.finish != FinishReason::HandedOff) return {{}, h};
    return {decode(r, h), h};
  }
  std::vector<int32_t> reference(Request r) {
    Events e;
    r.sink = e.sink();
    EXPECT_TRUE(both->submit(std::move(r)).accepted);
    return e.tokens();
  }
};

template <class F>
bool eventually(F f, double seconds = 10) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f();
}

class HandoverExact : public ::testing::TestWithParam<KvType> {};

TEST_P(HandoverExact, TokensEqualOneLoopDoingBothGreedyAndSeeded) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  PD pd(GetParam());
  for (float temp : {0.0f, 0.9f}) {
    const Request r = request(prompt_of(101, 3), temp, 24);
    const std::vector<int32_t> ref = pd.reference(r);
    auto [got, h] = pd.run(r);
    ASSERT_EQ(h.finish, FinishReason::HandedOff) << h.message;
    // 101 tokens: seven blocks; the second time the six full ones are there already.
    EXPECT_EQ(h.hand_off->blocks + h.hand_off->skipped_blocks, 7);
    EXPECT_EQ(h.hand_off->blocks, temp == 0 ? 7 : 1);
    EXPECT_EQ(got, ref) << "temperature " << temp;
    ASSERT_EQ(got.size(), 24u);
  }
  // A second prompt sharing the first 64 tokens: those four blocks stay home.
  std::vector<int32_t> p2 = prompt_of(101, 3);
  for (size_t i = 64; i < p2.size(); ++i) p2[i] = int32_t(5 + i % 50);
  const Request r2 = request(p2, 0, 8);
  auto [got2, h2] = pd.run(r2);
  EXPECT_EQ(h2.hand_off->skipped_blocks, 4);
  EXPECT_EQ(got2, pd.reference(r2));
  pd.pre->wait_idle();
  pd.dec->wait_idle();
  EXPECT_TRUE(eventually([&] { return pd.pre->metrics().kv_blocks_used == 0; }));
  EXPECT_EQ(pd.dec->metrics().kv_blocks_used, 0);
  EXPECT_EQ(pd.dec_role->holding(), 0);
  EXPECT_EQ(pd.pre_role->stats().transfers, 3);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, HandoverExact, ::testing::Values(KvType::F32, KvType::F16, KvType::Int8),
                         [](const auto& i) { return std::string(to_string(i.param)); });

TEST(HandoverFaults, FullDecodePoolIsNoRoomWithRetryAfterAndNothingLeaks) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  PD pd(KvType::F32, 16);  // one full context
  // An adoption not claimed yet holds ten of the sixteen blocks...
  const Request held = request(prompt_of(160, 9), 0, 4);
  const TokenEvent a = pd.prefill(held);
  ASSERT_EQ(a.finish, FinishReason::HandedOff) << a.message;
  // ...so a prompt of seven blocks finds no room.
  const Request r = request(prompt_of(101, 3), 0, 8);
  const TokenEvent h = pd.prefill(r);
  EXPECT_EQ(h.finish, FinishReason::Rejected);
  EXPECT_EQ(h.reject_reason, RejectReason::DecodeNoRoom);
  EXPECT_GT(h.retry_after_s, 0);
  EXPECT_TRUE(eventually([&] { return pd.pre->metrics().kv_blocks_used == 0; }));
  // Adopted between steps: the idle engine thread publishes it within a sweep period.
  EXPECT_TRUE(eventually([&] { return pd.dec->metrics().kv_blocks_used == 10; }));
  EXPECT_EQ(pd.dec_role->holding(), 1);
  // Once the first request has run, the second goes through.
  EXPECT_EQ(pd.decode(held, a).size(), 4u);
  auto [ok, h2] = pd.run(r);
  EXPECT_EQ(h2.finish, FinishReason::HandedOff) << h2.message;
  EXPECT_EQ(ok, pd.reference(r));
  pd.dec->wait_idle();
  EXPECT_EQ(pd.dec->metrics().kv_blocks_used, 0);
  EXPECT_EQ(pd.dec_role->holding(), 0);
}

TEST(HandoverFaults, UnknownHandleOrAnotherPromptEndsWithAnErrorAndFreesTheAdoption) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  PD pd(KvType::F32);
  Events e;
  Request r = request(prompt_of(40, 1), 0, 4);
  r.handover = Handover{999, 5, 0};
  r.sink = e.sink();
  ASSERT_TRUE(pd.dec->submit(std::move(r)).accepted);
  EXPECT_EQ(e.last().finish, FinishReason::Rejected);  // a 400, not the engine's 500
  EXPECT_EQ(e.last().reject_reason, RejectReason::Invalid);
  EXPECT_NE(e.last().message.find("gone"), std::string::npos);
  // A real handover claimed with another prompt: refused, and the adopted blocks freed.
  Events pe;
  Request rp = request(prompt_of(40, 1), 0, 4);
  rp.hand_off = true;
  rp.sink = pd.pre_role->wrap(pe.sink(), rp.scope);
  ASSERT_TRUE(pd.pre->submit(std::move(rp)).accepted);
  const TokenEvent h = pe.last();
  ASSERT_EQ(h.finish, FinishReason::HandedOff) << h.message;
  Events de;
  Request other = request(prompt_of(40, 2), 0, 4);
  other.handover = Handover{h.hand_off->handle, h.hand_off->first_token, 0};
  other.sink = de.sink();
  ASSERT_TRUE(pd.dec->submit(std::move(other)).accepted);
  EXPECT_EQ(de.last().finish, FinishReason::Rejected);
  pd.dec->wait_idle();
  EXPECT_EQ(pd.dec->metrics().kv_blocks_used, 0);
  EXPECT_EQ(pd.dec_role->holding(), 0);
}

TEST(HandoverFaults, UnreachableDecodeWorkerIsAnErrorAndThePrefillSequenceIsFreed) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  PD pd(KvType::F32);
  disagg::PrefillOptions nowhere{"127.0.0.1", 1, 2};
  disagg::PrefillRole lost(*pd.pre_exec, *pd.pre, {nowhere}, {});
  Events pe;
  Request rp = request(prompt_of(40, 1), 0, 4);
  rp.hand_off = true;
  rp.sink = lost.wrap(pe.sink(), rp.scope);
  ASSERT_TRUE(pd.pre->submit(std::move(rp)).accepted);
  EXPECT_EQ(pe.last().finish, FinishReason::Error);
  // Once, with the address (it read "decode worker 127.0.0.1:1 unreachable:
  // decode worker unreachable: ... (127.0.0.1:1)"; audit 9 L6).
  const std::string& msg = pe.last().message;
  const size_t at = msg.find("unreachable");
  EXPECT_NE(at, std::string::npos) << msg;
  EXPECT_EQ(msg.find("unreachable", at + 1), std::string::npos) << msg;
  EXPECT_NE(msg.find("127.0.0.1:1"), std::string::npos) << msg;
  EXPECT_TRUE(eventually([&] { return pd.pre->metrics().kv_blocks_used == 0; }));
}

}  // namespace
