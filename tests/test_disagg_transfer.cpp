// KV transfers between a prefill and a decode engine over UCX loopback, in
// one process (stories260K): greedy output after a transfer is token- and
// logit-identical to one engine doing both, for f32, f16 and int8 caches;
// shared prefixes travel once; and every failure (no room, a handshake with
// another model or kv type, a garbled, truncated or abandoned transfer)
// frees what the decode side reserved.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <random>
#include <thread>

#include "disagg/decode_endpoint.h"
#include "disagg/prefill_endpoint.h"
#include "disagg/ucx_link.h"
#include "disagg/wire.h"
#include "model/model.h"
#include "pool_owner.h"
#include "sched/executor.h"
#include "small_models.h"
#include "test_util.h"
#include "tools/make_model.h"

using namespace kvs;
using namespace kvs::disagg;

namespace {

int argmax(const float* p, int n) { return int(std::max_element(p, p + n) - p); }

struct Gen {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // the row each token was drawn from
};

// Greedy decode from a sequence that holds the prompt's K/V, `first` drawn;
// on `owner`'s thread when the pool has one.
Gen decode_from(PagedEngine& pe, SeqId seq, int32_t first, int n, test::PoolOwner* owner = nullptr) {
  Gen g;
  int32_t t = first;
  for (int i = 0; i < n; ++i) {
    g.tokens.push_back(t);
    const std::vector<int32_t> one{t};
    auto run = [&] { return pe.step({{seq, one}}); };
    StepResult s = owner ? owner->run(run) : run();
    EXPECT_TRUE(s.ok);
    g.logits.emplace_back(s.logits_of(0), s.logits_of(0) + s.n_vocab);
    t = argmax(s.logits_of(0), s.n_vocab);
  }
  return g;
}

// Prefills `prompt`; returns the sequence and its first greedy token.
std::pair<SeqId, int32_t> prefill(PagedEngine& pe, const std::vector<int32_t>& prompt, const Scope& scope) {
  const SeqAdmission a = pe.add(prompt, scope);
  StepResult s = pe.step({{a.seq, uncached_tail(prompt, a)}});
  EXPECT_TRUE(s.ok);
  return {a.seq, argmax(s.logits_of(0), s.n_vocab)};
}

std::vector<int32_t> random_prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = int32_t(3 + rng() % 500);
  return p;
}

int32_t used(PagedEngine& pe, test::PoolOwner& owner) {
  return owner.run([&] { return pe.kv().used_blocks(); });
}

// Waits (bounded) until `f` holds.
template <class F>
bool eventually(F f, double seconds = 10) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f();
}

struct Engines {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Engine> engine;
  PagedEngineOptions o;
  explicit Engines(KvType type, int64_t n_blocks = 64, std::shared_ptr<const Model> m = nullptr) {
    model = m ? m : Model::load(test::shared("models/stories260K/stories260K.gguf"));
    engine = std::make_unique<Engine>(model, EngineOptions{1});
    o.block_size = 16;
    o.n_blocks = n_blocks;
    o.max_ctx = 256;
    o.cache.type = type;
  }
  std::unique_ptr<PagedEngine> paged(int64_t n_blocks = 0) {
    PagedEngineOptions p = o;
    if (n_blocks) p.n_blocks = n_blocks;
    return std::make_unique<PagedEngine>(*engine, p);
  }
  // A decode side: its pool has an owner thread, as under an engine loop.
  std::unique_ptr<sched::PagedExecutor> executor(int64_t n_blocks = 0) {
    PagedEngineOptions p = o;
    if (n_blocks) p.n_blocks = n_blocks;
    return std::make_unique<sched::PagedExecutor>(*engine, p);
  }
};

class DisaggExact : public ::testing::TestWithParam<KvType> {};

TEST_P(DisaggExact, DecodeAfterTransferEqualsOneEngineDoingBoth) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  Engines e(GetParam());
  auto both = e.paged(), pre = e.paged();
  auto decx = e.executor();
  PagedEngine* dec = &decx->paged();
  test::PoolOwner owner(*decx);
  PagedAdoptionPool pool(*dec, owner);
  DecodeEndpoint decode(pool, {});
  PrefillEndpoint link(identity_of(*pre), {"127.0.0.1", decode.port()});
  const Scope scope = make_scope("test", "tenant");
  const int32_t idle = used(*dec, owner);

  // 101 tokens: six full blocks and a tail; int8 keeps the open group in the residual.
  const std::vector<int32_t> prompt = random_prompt(101, 7);
  auto [ref_seq, ref_first] = prefill(*both, prompt, scope);
  const Gen ref = decode_from(*both, ref_seq, ref_first, 16);

  auto [seq, first] = prefill(*pre, prompt, scope);
  EXPECT_EQ(first, ref_first);
  const ShipResult r = link.ship(shipment_of(*pre, seq, scope, first));
  pre->release(seq);
  ASSERT_EQ(r.status, ShipResult::Status::Ok) << r.reason;
  EXPECT_EQ(r.blocks_sent, 7);
  EXPECT_EQ(r.blocks_skipped, 0);
  EXPECT_EQ(r.bytes, 7 * int64_t(pre->layout().block_bytes()));
  const auto adopted = decode.claim(r.handle);
  ASSERT_TRUE(adopted);
  EXPECT_FALSE(decode.claim(r.handle)) << "a handle is claimed once";
  EXPECT_EQ(adopted->prompt, prompt);
  EXPECT_EQ(adopted->first_token, first);
  const Gen got = decode_from(*dec, adopted->seq, adopted->first_token, 16, &owner);
  EXPECT_EQ(got.tokens, ref.tokens);
  for (size_t i = 0; i < ref.logits.size(); ++i)
    EXPECT_EQ(std::memcmp(got.logits[i].data(), ref.logits[i].data(), ref.logits[i].size() * sizeof(float)), 0)
        << "logits differ at step " << i;
  owner.run([&] {
    dec->kv().check_invariants(true);
    // The adopted full blocks are in the decode side's prefix index.
    EXPECT_EQ(dec->kv().cached_prefix_blocks(prompt, dec->kv_scope(scope)), 6);
    dec->release(adopted->seq);
  });
  EXPECT_EQ(used(*dec, owner), idle);

  // A prompt sharing the first 64 tokens: their four blocks are not sent again.
  std::vector<int32_t> second = random_prompt(90, 8);
  std::copy(prompt.begin(), prompt.begin() + 64, second.begin());
  auto [seq2, first2] = prefill(*pre, second, scope);
  const ShipResult r2 = link.ship(shipment_of(*pre, seq2, scope, first2));
  pre->release(seq2);
  ASSERT_EQ(r2.status, ShipResult::Status::Ok) << r2.reason;
  EXPECT_EQ(r2.blocks_skipped, 4);
  EXPECT_EQ(r2.blocks_sent, 2);
  const auto ad2 = decode.claim(r2.handle);
  ASSERT_TRUE(ad2);
  auto [ref2, ref2_first] = prefill(*both, second, scope);
  EXPECT_EQ(decode_from(*dec, ad2->seq, first2, 8, &owner).tokens, decode_from(*both, ref2, ref2_first, 8).tokens);
  owner.run([&] { dec->release(ad2->seq); });
  EXPECT_EQ(used(*dec, owner), idle);
  const TransferStats ps = link.stats(), ds = decode.stats();
  EXPECT_EQ(ps.transfers, 2);
  EXPECT_EQ(ds.blocks, 9);
  EXPECT_EQ(ds.skipped_blocks, 4);
  EXPECT_EQ(ds.bytes, ps.bytes);
  EXPECT_EQ(decode.holding(), 0);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, DisaggExact, ::testing::Values(KvType::F32, KvType::F16, KvType::Int8),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// A hybrid cache (a Gemma 2 shaped model made here: a full-attention table
// and a table of 16-token windows): the prompt's block list is each table's
// blocks the first decode step sees, block by block, and only the entries
// the decode side lacks travel. Decoding after the transfer equals one
// engine doing both.
TEST(DisaggTransfer, HybridShipsEachTablesVisibleBlocks) {
  const std::string gemma2 = test::make_windowed_gemma2("disagg-gemma2.gguf");
  Engines e(KvType::F16, 64, Model::load(gemma2));
  auto both = e.paged(), pre = e.paged();
  ASSERT_EQ(pre->kv().n_tables(), 2);
  auto decx = e.executor();
  PagedEngine* dec = &decx->paged();
  test::PoolOwner owner(*decx);
  PagedAdoptionPool pool(*dec, owner);
  DecodeEndpoint decode(pool, {});
  PrefillEndpoint link(identity_of(*pre), {"127.0.0.1", decode.port()});
  const Scope scope = make_scope("test", "tenant");
  const int32_t idle = used(*dec, owner);
  // 101 tokens: the full table's 7 blocks, and the windowed table's blocks 5
  // and 6 (the query at 101 sees 86..101).
  const std::vector<int32_t> prompt = random_prompt(101, 7);
  auto [ref_seq, ref_first] = prefill(*both, prompt, scope);
  const Gen ref = decode_from(*both, ref_seq, ref_first, 24);
  auto [seq, first] = prefill(*pre, prompt, scope);
  const Shipment sh = shipment_of(*pre, seq, scope, first);
  EXPECT_EQ(sh.blocks.size(), 9u);
  const ShipResult r = link.ship(sh);
  pre->release(seq);
  ASSERT_EQ(r.status, ShipResult::Status::Ok) << r.reason;
  EXPECT_EQ(r.blocks_sent, 9);
  EXPECT_EQ(r.bytes, 9 * int64_t(pre->layout().block_bytes()));
  const auto adopted = decode.claim(r.handle);
  ASSERT_TRUE(adopted);
  const Gen got = decode_from(*dec, adopted->seq, adopted->first_token, 24, &owner);
  EXPECT_EQ(got.tokens, ref.tokens);
  for (size_t i = 0; i < ref.logits.size(); ++i)
    EXPECT_EQ(std::memcmp(got.logits[i].data(), ref.logits[i].data(), ref.logits[i].size() * sizeof(float)), 0)
        << "logits differ at step " << i;
  owner.run([&] {
    dec->kv().check_invariants(true);
    dec->release(adopted->seq);
  });
  // 90 tokens sharing the first 64: blocks 0..3 are hits (the windowed
  // table does not need them: the query at 90 sees 75..90); blocks 4 and 5
  // of both tables travel.
  std::vector<int32_t> second = random_prompt(90, 8);
  std::copy(prompt.begin(), prompt.begin() + 64, second.begin());
  auto [seq2, first2] = prefill(*pre, second, scope);
  const ShipResult r2 = link.ship(shipment_of(*pre, seq2, scope, first2));
  pre->release(seq2);
  ASSERT_EQ(r2.status, ShipResult::Status::Ok) << r2.reason;
  EXPECT_EQ(r2.blocks_skipped, 4);
  EXPECT_EQ(r2.blocks_sent, 4);
  const auto ad2 = decode.claim(r2.handle);
  ASSERT_TRUE(ad2);
  auto [ref2, ref2_first] = prefill(*both, second, scope);
  EXPECT_EQ(decode_from(*dec, ad2->seq, first2, 24, &owner).tokens, decode_from(*both, ref2, ref2_first, 24).tokens);
  owner.run([&] {
    dec->kv().check_invariants(true);
    dec->release(ad2->seq);
  });
  EXPECT_EQ(used(*dec, owner), idle);
}

TEST(DisaggTransfer, BytesPerPromptTokenEqualTheFormula) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  Engines e(KvType::F32);
  auto pre = e.paged();
  auto decx = e.executor();
  PagedEngine* dec = &decx->paged();
  test::PoolOwner owner(*decx);
  PagedAdoptionPool pool(*dec, owner);
  DecodeEndpoint decode(pool, {});
  PrefillEndpoint link(identity_of(*pre), {"127.0.0.1", decode.port()});
  const ModelConfig& c = e.model->config();
  const std::vector<int32_t> prompt = random_prompt(128, 3);  // whole blocks: no tail slots
  const Scope scope = make_scope("test", "t");
  auto [seq, first] = prefill(*pre, prompt, scope);
  const ShipResult r = link.ship(shipment_of(*pre, seq, scope, first));
  ASSERT_EQ(r.status, ShipResult::Status::Ok) << r.reason;
  // 2 (K and V) x layers x KV heads x head dim x bytes per element, per token.
  const int64_t per_token = 2LL * c.n_layers * c.n_kv_heads * c.head_dim * 4;
  EXPECT_EQ(r.bytes, per_token * int64_t(prompt.size()));
  auto ad = decode.claim(r.handle);
  ASSERT_TRUE(ad);
  owner.run([&] { dec->release(ad->seq); });
}

TEST(DisaggFaults, FullDecodePoolAnswersNoRoomAndKeepsNothing) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  Engines e(KvType::F32);
  auto pre = e.paged();
  auto decx = e.executor(16);
  PagedEngine* dec = &decx->paged();
  test::PoolOwner owner(*decx);
  PagedAdoptionPool pool(*dec, owner);
  DecodeEndpoint decode(pool, {});
  PrefillEndpoint link(identity_of(*pre), {"127.0.0.1", decode.port()});
  const Scope scope = make_scope("test", "t");
  // A running sequence on the decode side holds 14 of 16 blocks.
  const std::vector<int32_t> big = random_prompt(220, 1);
  const SeqId hold = owner.run([&] {
    const SeqId h = dec->add(big, scope).seq;
    EXPECT_TRUE(dec->step({{h, big}}).ok);
    return h;
  });
  const int32_t before = used(*dec, owner);
  const std::vector<int32_t> prompt = random_prompt(60, 2);  // 4 blocks
  auto [seq, first] = prefill(*pre, prompt, scope);
  const ShipResult r = link.ship(shipment_of(*pre, seq, scope, first));
  EXPECT_EQ(r.status, ShipResult::Status::NoRoom) << r.reason;
  EXPECT_GT(r.retry_after_s, 0);
  EXPECT_NE(r.reason.find("no free KV blocks"), std::string::npos) << r.reason;
  EXPECT_EQ(used(*dec, owner), before);
  EXPECT_EQ(decode.holding(), 0);
  // Room again: the same shipment goes through.
  owner.run([&] { dec->release(hold); });
  const ShipResult ok = link.ship(shipment_of(*pre, seq, scope, first));
  ASSERT_EQ(ok.status, ShipResult::Status::Ok) << ok.reason;
  auto ad = decode.claim(ok.handle);
  ASSERT_TRUE(ad);
  owner.run([&] { dec->release(ad->seq); });
  EXPECT_EQ(used(*dec, owner), 0);
}

TEST(DisaggFaults, HandshakeWithAnotherModelOrKvTypeIsRefusedOnBothSides) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  Engines e(KvType::F16);
  auto decx = e.executor();
  PagedEngine* dec = &decx->paged();
  test::PoolOwner owner(*decx);
  PagedAdoptionPool pool(*dec, owner);
  std::mutex log_mu;
  std::vector<std::string> decode_log;
  DecodeEndpoint decode(pool, {}, [&](const std::string& s) {
    std::lock_guard lk(log_mu);
    decode_log.push_back(s);
  });
  Engines f32(KvType::F32);
  auto pre = f32.paged();
  try {
    PrefillEndpoint link(identity_of(*pre), {"127.0.0.1", decode.port()});
    FAIL() << "an f32 prefill worker was accepted by an f16 decode worker";
  } catch (const HandshakeError& err) {
    EXPECT_NE(std::string(err.what()).find("kv type: f16 here, f32 there"), std::string::npos) << err.what();
  }
  KvIdentity other = identity_of(*dec);
  other.model = "another-model";
  EXPECT_THROW(PrefillEndpoint(other, {"127.0.0.1", decode.port()}), HandshakeError);
  {
    std::lock_guard lk(log_mu);
    auto logged = [&](const std::string& what) {
      return std::any_of(decode_log.begin(), decode_log.end(),
                         [&](const std::string& l) { return l.find("refuses") != std::string::npos &&
                                                            l.find(what) != std::string::npos; });
    };
    EXPECT_TRUE(logged("kv type: f16 here, f32 there"));
    EXPECT_TRUE(logged("model: different weights"));
  }
  // The decode worker still serves a matching prefill worker.
  PrefillEndpoint good(identity_of(*dec), {"127.0.0.1", decode.port()});
  EXPECT_TRUE(good.connected());
}

TEST(DisaggFaults, UnreachableDecodeWorkerIsAClearError) {
  uint16_t port;
  {
    // A port that was free a moment ago: nobody listens there now.
    Engines e(KvType::F32);
    auto decx = e.executor();
    test::PoolOwner owner(*decx);
    PagedAdoptionPool pool(decx->paged(), owner);
    DecodeEndpoint gone(pool, {});
    port = gone.port();
  }
  KvIdentity id;
  try {
    PrefillEndpoint link(id, {"127.0.0.1", port, 3});
    FAIL() << "connected to nobody";
  } catch (const HandshakeError&) {
    FAIL() << "an unreachable worker is not a refusal";
  } catch (const std::runtime_error& err) {
    EXPECT_NE(std::string(err.what()).find("decode worker"), std::string::npos) << err.what();
  }
}

// A hand-driven prefill peer over a real UCX connection, for the transfers a
// well-behaved PrefillEndpoint never sends.
class RawPeer {
 public:
  explicit RawPeer(uint16_t port) {
    UcxLink::Handlers h;
    h.on_message = [this](ConnId, std::span<const uint8_t> hd, Incoming&) {
      std::lock_guard lk(mu_);
      inbox_.emplace_back(hd.begin(), hd.end());
      cv_.notify_all();
    };
    h.on_disconnect = [this](ConnId, const std::string&) {
      std::lock_guard lk(mu_);
      gone_ = true;
      cv_.notify_all();
    };
    link_ = std::make_unique<UcxLink>(std::move(h));
    conn_ = link_->connect("127.0.0.1", port);
  }
  void send(std::vector<uint8_t> hdr, std::span<const uint8_t> data = {}) { link_->send(conn_, std::move(hdr), data); }
  std::optional<std::vector<uint8_t>> next(double seconds = 5) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, std::chrono::duration<double>(seconds), [&] { return !inbox_.empty(); })) return std::nullopt;
    auto m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }
  void kill() { link_.reset(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> inbox_;
  bool gone_ = false;
  std::unique_ptr<UcxLink> link_;
  ConnId conn_ = 0;
};

struct FaultRig {
  Engines e{KvType::Int8};
  std::unique_ptr<PagedEngine> pre = e.paged();
  std::unique_ptr<sched::PagedExecutor> decx = e.executor();
  PagedEngine* dec = &decx->paged();
  test::PoolOwner owner{*decx};
  PagedAdoptionPool pool{*dec, owner};
  std::vector<std::string> log;
  std::mutex log_mu;
  DecodeEndpoint decode{pool, {}, [this](const std::string& s) {
                          std::lock_guard lk(log_mu);
                          log.push_back(s);
                        }};
  Scope scope = make_scope("test", "t");
  std::vector<int32_t> prompt = random_prompt(70, 5);  // 5 blocks
  SeqId seq = -1;
  Shipment ship;
  FaultRig() {
    auto [s, first] = prefill(*pre, prompt, scope);
    seq = s;
    ship = shipment_of(*pre, seq, scope, first);
  }
  // Handshake and offer: returns the decode side's answer.
  Answer open(RawPeer& p, uint64_t xfer) {
    p.send(encode_hello(identity_of(*pre)));
    auto hr = p.next();
    EXPECT_TRUE(hr && decode_hello_reply(*hr) && decode_hello_reply(*hr)->ok);
    p.send(encode(Offer{xfer, scope, ship.first_token, ship.prompt, ship.keys}));
    auto a = p.next();
    EXPECT_TRUE(a && decode_answer(*a));
    return a && decode_answer(*a) ? *decode_answer(*a) : Answer{};
  }
  bool idle() { return decode.holding() == 0 && used(*dec, owner) == 0; }
  bool logged(const std::string& what) {
    std::lock_guard lk(log_mu);
    for (const auto& l : log)
      if (l.find(what) != std::string::npos) return true;
    return false;
  }
};

TEST(DisaggFaults, TruncatedTransferFreesTheReservedBlocks) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  FaultRig rig;
  RawPeer p(rig.decode.port());
  const Answer a = rig.open(p, 1);
  ASSERT_EQ(a.kind, AnswerKind::Send);
  EXPECT_EQ(a.to - a.from, 5u);
  EXPECT_EQ(used(*rig.dec, rig.owner), 5) << "reserved before any block moves";
  p.send(encode(BlockHeader{1, 0}), rig.ship.blocks[0]);
  p.send(encode(BlockHeader{1, 1}), rig.ship.blocks[1]);
  const auto* res = reinterpret_cast<const uint8_t*>(rig.ship.residual.data());
  p.send(encode(DoneHeader{1, 2}), {res, rig.ship.residual.size() * sizeof(float)});
  auto r = p.next();
  ASSERT_TRUE(r && decode_result(*r));
  EXPECT_FALSE(decode_result(*r)->ok);
  EXPECT_NE(decode_result(*r)->reason.find("truncated"), std::string::npos) << decode_result(*r)->reason;
  EXPECT_TRUE(eventually([&] { return rig.idle(); }));
  // A block of the wrong size fails its transfer the same way.
  const Answer b = rig.open(p, 2);
  ASSERT_EQ(b.kind, AnswerKind::Send);
  p.send(encode(BlockHeader{2, 0}), rig.ship.blocks[0].subspan(1));
  r = p.next();
  ASSERT_TRUE(r && decode_result(*r));
  EXPECT_NE(decode_result(*r)->reason.find("bytes, expected"), std::string::npos) << decode_result(*r)->reason;
  EXPECT_TRUE(eventually([&] { return rig.idle(); }));
}

TEST(DisaggFaults, GarbledMessageDropsTheConnectionAndItsBlocks) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  FaultRig rig;
  RawPeer p(rig.decode.port());
  ASSERT_EQ(rig.open(p, 1).kind, AnswerKind::Send);
  p.send(encode(BlockHeader{1, 0}), rig.ship.blocks[0]);
  std::vector<uint8_t> junk = encode(BlockHeader{1, 1});
  junk.resize(5);  // cut inside the transfer id
  p.send(junk, rig.ship.blocks[1]);
  EXPECT_TRUE(eventually([&] { return rig.idle(); }));
  EXPECT_TRUE(rig.logged("garbled block header"));
  // Chain keys that do not match the tokens are refused before reserving.
  RawPeer q(rig.decode.port());
  q.send(encode_hello(identity_of(*rig.pre)));
  ASSERT_TRUE(q.next());
  Offer bad{3, rig.scope, rig.ship.first_token, rig.ship.prompt, rig.ship.keys};
  bad.keys[2][0] ^= 1;
  q.send(encode(bad));
  auto a = q.next();
  ASSERT_TRUE(a && decode_answer(*a));
  EXPECT_EQ(decode_answer(*a)->kind, AnswerKind::Refused);
  EXPECT_TRUE(rig.idle());
  // The decode worker keeps serving well-formed transfers.
  PrefillEndpoint good(identity_of(*rig.pre), {"127.0.0.1", rig.decode.port()});
  const ShipResult ok = good.ship(rig.ship);
  ASSERT_EQ(ok.status, ShipResult::Status::Ok) << ok.reason;
  auto ad = rig.decode.claim(ok.handle);
  ASSERT_TRUE(ad);
  rig.owner.run([&] { rig.dec->release(ad->seq); });
}

TEST(DisaggFaults, PrefillGoneMidTransferFreesTheReservedBlocks) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  FaultRig rig;
  {
    RawPeer p(rig.decode.port());
    ASSERT_EQ(rig.open(p, 1).kind, AnswerKind::Send);
    p.send(encode(BlockHeader{1, 0}), rig.ship.blocks[0]);
    EXPECT_TRUE(eventually([&] { return rig.decode.stats().blocks == 0 && used(*rig.dec, rig.owner) == 5; }, 2));
    p.kill();
  }
  EXPECT_TRUE(eventually([&] { return rig.idle(); })) << "holding " << rig.decode.holding() << ", used "
                                                     << used(*rig.dec, rig.owner);
}

TEST(DisaggFaults, StalledOrUnclaimedTransfersTimeOut) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  Engines e(KvType::F32);
  auto pre = e.paged();
  auto decx = e.executor();
  PagedEngine* dec = &decx->paged();
  test::PoolOwner owner(*decx);
  PagedAdoptionPool pool(*dec, owner);
  DecodeOptions o;
  o.transfer_timeout_s = 0.3;
  o.claim_timeout_s = 0.3;
  DecodeEndpoint decode(pool, o);
  const Scope scope = make_scope("test", "t");
  const std::vector<int32_t> prompt = random_prompt(40, 9);
  auto [seq, first] = prefill(*pre, prompt, scope);
  const Shipment ship = shipment_of(*pre, seq, scope, first);
  RawPeer p(decode.port());
  p.send(encode_hello(identity_of(*pre)));
  ASSERT_TRUE(p.next());
  p.send(encode(Offer{1, scope, first, ship.prompt, ship.keys}));
  ASSERT_TRUE(p.next());
  EXPECT_EQ(used(*dec, owner), 3);
  auto r = p.next(3);  // nothing more sent: the decode side gives up
  ASSERT_TRUE(r && decode_result(*r));
  EXPECT_NE(decode_result(*r)->reason.find("timed out"), std::string::npos);
  EXPECT_TRUE(eventually([&] { return decode.holding() == 0 && used(*dec, owner) == 0; }));
  // Adopted but never claimed.
  PrefillEndpoint link(identity_of(*pre), {"127.0.0.1", decode.port()});
  ASSERT_EQ(link.ship(ship).status, ShipResult::Status::Ok);
  EXPECT_TRUE(eventually([&] { return decode.holding() == 0 && used(*dec, owner) == 0; }));
}

// A prefill engine shipping to a decode endpoint in this process (F32 KV),
// for the hand-over bookkeeping tests below.
struct HandOverRig {
  Engines e{KvType::F32};
  std::unique_ptr<PagedEngine> pre = e.paged();
  std::unique_ptr<sched::PagedExecutor> decx = e.executor();
  PagedEngine* dec = &decx->paged();
  test::PoolOwner owner{*decx};
  PagedAdoptionPool pool{*dec, owner};
  DecodeEndpoint decode;
  PrefillEndpoint link{identity_of(*pre), {"127.0.0.1", decode.port()}};
  const Scope scope = make_scope("test", "t");
  explicit HandOverRig(const DecodeOptions& o) : decode(pool, o) {}
  // An n-token prompt prefilled and shipped: its handle.
  uint64_t ship(int n, uint32_t seed) {
    auto [seq, first] = prefill(*pre, random_prompt(n, seed), scope);
    const ShipResult r = link.ship(shipment_of(*pre, seq, scope, first));
    pre->release(seq);
    EXPECT_EQ(r.status, ShipResult::Status::Ok) << r.reason;
    return r.handle;
  }
};

// Hand-overs no request has come for are bounded (audit 9 M6): anyone who
// can post to a prefill worker makes them, and each pinned its blocks for
// the whole claim timeout. Bound 6 blocks; 40-token prompts take 3 blocks,
// a 120-token one 8.
TEST(DisaggFaults, UnclaimedHandOversOverTheBoundFreeTheOldest) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  DecodeOptions o;
  o.unclaimed_max_blocks = 6;
  HandOverRig rig(o);
  PagedEngine* dec = rig.dec;
  test::PoolOwner& owner = rig.owner;
  DecodeEndpoint& decode = rig.decode;
  auto ship = [&](int n, uint32_t seed) { return rig.ship(n, seed); };
  auto used_is = [&](int32_t n) { return eventually([&] { return used(*dec, owner) == n; }); };
  const uint64_t a = ship(40, 11), b = ship(40, 12);
  EXPECT_EQ(decode.unclaimed_blocks(), 6);
  const uint64_t c = ship(40, 13);  // 9 blocks: the oldest, a, goes
  EXPECT_EQ(decode.unclaimed_blocks(), 6);
  EXPECT_EQ(decode.holding(), 2);
  EXPECT_EQ(decode.stats().unclaimed_released, 1);
  EXPECT_FALSE(decode.claim(a));
  EXPECT_TRUE(used_is(6)) << used(*dec, owner);
  // b's request arrived: it waits in the queue, no longer counted.
  std::shared_ptr<void> hold = decode.await_claim(b);
  EXPECT_EQ(hold.use_count(), 1);
  EXPECT_EQ(decode.await_claim(a).use_count(), 0);  // gone: nothing to wait for
  EXPECT_EQ(decode.unclaimed_blocks(), 3);
  const uint64_t d = ship(40, 14);
  EXPECT_EQ(decode.unclaimed_blocks(), 6);
  EXPECT_EQ(decode.stats().unclaimed_released, 1);
  // 14 blocks: c and d go; the newest stays, over the bound on its own.
  const uint64_t big = ship(120, 15);
  EXPECT_EQ(decode.unclaimed_blocks(), 8);
  EXPECT_EQ(decode.stats().unclaimed_released, 3);
  EXPECT_EQ(decode.holding(), 2);  // b and big
  EXPECT_FALSE(decode.claim(c));
  EXPECT_FALSE(decode.claim(d));
  EXPECT_TRUE(used_is(3 + 8)) << used(*dec, owner);
  // b's request ended unclaimed: its blocks go at once, not at the claim timeout.
  hold.reset();
  EXPECT_EQ(decode.holding(), 1);
  EXPECT_FALSE(decode.claim(b));
  EXPECT_TRUE(used_is(8)) << used(*dec, owner);
  auto ad = decode.claim(big);
  ASSERT_TRUE(ad);
  EXPECT_EQ(decode.unclaimed_blocks(), 0);
  owner.run([&] { dec->release(ad->seq); });
  EXPECT_EQ(used(*dec, owner), 0);
}

// Hand-over handles are random: a counted one could be guessed by any
// client of the decode worker, and a claim with another prompt frees the
// hand-over it names. Distinct, not neighbours, exact as JSON numbers.
TEST(DisaggFaults, HandOverHandlesAreNotGuessable) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  HandOverRig rig(DecodeOptions{});
  DecodeEndpoint& decode = rig.decode;
  std::vector<uint64_t> h;
  for (uint32_t i = 0; i < 4; ++i) h.push_back(rig.ship(20, 30 + i));
  for (size_t i = 0; i < h.size(); ++i) {
    EXPECT_NE(h[i], 0u);
    EXPECT_LT(h[i], uint64_t(1) << 53);
    for (size_t j = 0; j < i; ++j) {
      EXPECT_NE(h[i], h[j]);
      EXPECT_GT(h[i] > h[j] ? h[i] - h[j] : h[j] - h[i], 1000u) << "handles " << h[j] << " and " << h[i];
    }
  }
  // Guessing the neighbours of a handle claims nothing and frees nothing.
  EXPECT_FALSE(decode.claim(h[0] + 1));
  EXPECT_FALSE(decode.claim(h[0] - 1));
  EXPECT_EQ(decode.holding(), 4);
  for (uint64_t x : h) {
    auto ad = decode.claim(x);
    ASSERT_TRUE(ad);
    rig.owner.run([&] { rig.dec->release(ad->seq); });
  }
  EXPECT_EQ(used(*rig.dec, rig.owner), 0);
}

}  // namespace
