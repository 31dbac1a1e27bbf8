// Window policies (kv/window_policy.h): which keys a query sees and at which
// RoPE positions, exact for every kind; attention with keys stored before
// RoPE equals rotating them at the documented positions; the engine's
// results do not depend on chunking or on the pool; KV memory stays
// constant however long a sequence grows; and a stream 20 windows long is
// still fluent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "engine/kv_eval.h"
#include "engine/local_sequence.h"
#include "engine/paged_engine.h"
#include "engine/perplexity.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "kv/block_storage.h"
#include "kv/kv_manager.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "engine_test_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvs;
using V = std::vector<int32_t>;

namespace {

#define SKIP_WITHOUT_SHARED()                                             \
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present"

std::shared_ptr<const Model> stories() {
  return Model::load(test::shared("models/stories260K/stories260K.gguf"));
}

using test::random_tokens;

// --- the policy arithmetic, value by value ---

TEST(WindowPolicy, StreamingSinksAndWindow) {
  const WindowPolicy w = WindowPolicy::streaming(8, 4);
  // Until the window leaves the sinks behind, everything is visible at text positions.
  for (int p : {0, 5, 11}) {
    const WindowView v = w.view(p);
    EXPECT_EQ(v.shift, 0) << p;
    EXPECT_GE(v.sink_end, v.win_start) << p << ": all visible";
  }
  // p = 12: window [5, 12], sinks [0, 4): positions 0..3 then 4..11, query at 11 = S + W - 1.
  WindowView v = w.view(12);
  EXPECT_EQ(v.sink_end, 4);
  EXPECT_EQ(v.win_start, 5);
  EXPECT_EQ(v.shift, 1);
  v = w.view(1000);
  EXPECT_EQ(v.win_start, 993);
  EXPECT_EQ(1000 - v.shift, 11) << "the query always sits at S + W - 1";
  EXPECT_EQ(993 - v.shift, 4) << "the oldest window key right after the sinks";
  EXPECT_EQ(w.max_visible(), 12);
  EXPECT_EQ(w.dead_range(1000), std::make_pair(4, 993));
  // Plain window (no sinks): positions 0..W-1.
  const WindowPolicy b = WindowPolicy::streaming(8, 0);
  v = b.view(100);
  EXPECT_EQ(v.sink_end, 0);
  EXPECT_EQ(v.win_start, 93);
  EXPECT_EQ(v.shift, 93);
}

TEST(WindowPolicy, ContextShiftDiscardsHalfWhenFull) {
  // Cache of 16, keep 4: n_discard = 6. Tokens 0..15 fill it; token 16
  // forces one shift (tokens 4..9 go), 22 the next (10..15), ...
  const WindowPolicy w = WindowPolicy::context_shift(16, 4);
  EXPECT_EQ(w.view(15).shift, 0);
  EXPECT_EQ(w.view(16).shift, 6);
  EXPECT_EQ(w.view(16).win_start, 10);
  EXPECT_EQ(w.view(21).shift, 6);
  EXPECT_EQ(w.view(22).shift, 12);
  EXPECT_EQ(w.view(22).sink_end, 4);
  EXPECT_EQ(w.view(22).win_start, 16);
  // The cache never holds more than C tokens: kept + window <= 16.
  for (int p = 0; p < 500; ++p) {
    const WindowView v = w.view(p);
    const int held = v.sink_end >= v.win_start ? p + 1 : v.sink_end + (p + 1 - v.win_start);
    EXPECT_LE(held, 16) << p;
    EXPECT_LE(p - v.shift, 15) << p << ": positions stay inside the cache";
  }
}

TEST(WindowPolicy, NativeWindowKeepsTextPositions) {
  const WindowPolicy w = WindowPolicy::native(4096);
  EXPECT_EQ(w.view(100).win_start, 0);
  EXPECT_EQ(w.view(5000).win_start, 905);
  EXPECT_EQ(w.view(5000).shift, 0);
  EXPECT_FALSE(w.rotates());
  EXPECT_TRUE(WindowPolicy::streaming(4, 1).rotates());
  // None resolves to the model's declared window.
  EXPECT_EQ(WindowPolicy{}.resolve(4096).kind, WindowKind::Native);
  EXPECT_EQ(WindowPolicy{}.resolve(0).kind, WindowKind::None);
  EXPECT_EQ(WindowPolicy::streaming(8, 2).resolve(4096).kind, WindowKind::Streaming);
  EXPECT_THROW(WindowPolicy::streaming(0, 2).validate(), std::invalid_argument);
  EXPECT_THROW(WindowPolicy::context_shift(5, 4).validate(), std::invalid_argument);
}

// --- attention: keys stored before RoPE, rotated at the documented positions ---

TEST(WindowAttention, RotatesKeysToTheirWindowPositions) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int nh = 4, nkv = 2, hd = 16, bs = 8, n_ctx = 61, n_rot = 16, r = nh / nkv;
  const size_t row = size_t(nkv) * hd;
  KvLayout lay{1, nkv, hd, bs};
  const int nb = (n_ctx + bs - 1) / bs;
  BlockStorage st(lay, nb + 2);
  V table(static_cast<size_t>(nb));
  for (int i = 0; i < nb; ++i) table[size_t(i)] = nb + 1 - i;
  std::vector<float> k(size_t(n_ctx) * row), v(k.size()), q(size_t(nh) * hd);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  for (int t = 0; t < n_ctx; ++t) {
    std::memcpy(st.view().k(table[size_t(t / bs)], 0, t % bs), &k[size_t(t) * row], row * 4);
    std::memcpy(st.view().v(table[size_t(t / bs)], 0, t % bs), &v[size_t(t) * row], row * 4);
  }
  for (bool neox : {false, true}) {
    const WindowPolicy w = WindowPolicy::streaming(20, 3);
    const int p = n_ctx - 1;
    const WindowView vw = w.view(p);
    ASSERT_EQ(vw.sink_end, 3);
    ASSERT_EQ(vw.win_start, 41);
    std::vector<float> cs(size_t(64) * (n_rot / 2)), sn(cs.size());
    RopeTable rt;
    for (int i = 0; i < 64; ++i) rt.compute(i, n_rot, 10000.f, &cs[size_t(i) * (n_rot / 2)], &sn[size_t(i) * (n_rot / 2)]);
    AttnSeq as{table.data(), n_ctx, n_ctx, nullptr, nullptr};
    as.sink_end = vw.sink_end;
    as.win_start = vw.win_start;
    as.rope_cos = cs.data();
    as.rope_sin = sn.data();
    as.shift = vw.shift;
    as.n_rot = n_rot;
    as.neox = neox;
    const AttnShape shape{nh, nkv, hd, 1.0f / std::sqrt(float(hd))};
    std::vector<float> out(q.size()), scratch(attention_scratch_floats(r, hd));
    for (int g = 0; g < nkv; ++g) attention_group(q.data(), st.view(), 0, as, g, shape, out.data(), scratch.data());
    // Reference: the visible keys, rotated at the documented positions
    // (sinks at 0, 1, 2; the window at 3 .. 22), in a contiguous cache.
    std::vector<float> kr, vr;
    auto take = [&](int t, int pos) {
      std::vector<float> kk(&k[size_t(t) * row], &k[size_t(t) * row] + row);
      rope_apply(kk.data(), nkv, hd, n_rot, neox, &cs[size_t(pos) * (n_rot / 2)], &sn[size_t(pos) * (n_rot / 2)]);
      kr.insert(kr.end(), kk.begin(), kk.end());
      vr.insert(vr.end(), &v[size_t(t) * row], &v[size_t(t) * row] + row);
    };
    for (int t = 0; t < 3; ++t) take(t, t);
    for (int t = 41; t <= p; ++t) take(t, t - 38);
    EXPECT_EQ(p - vw.shift, 22);
    std::vector<float> ref(q.size());
    attention_reference(q.data(), kr.data(), vr.data(), int(kr.size() / row), shape, ref.data());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 2e-5 * (1 + std::fabs(ref[i]))) << i;
  }
}

// --- the block manager frees exactly the blocks the window left behind ---

TEST(WindowKvManager, FreesExactBlocksAndKeepsInvariants) {
  KvManagerOptions o;
  o.block_size = 4;
  o.prefix_caching = false;
  o.window = WindowPolicy::streaming(8, 2);  // live: sinks in block 0, the window's 8 tokens
  KvManager kv(16, o);
  const auto a = kv.add_sequence(V{1}, {});
  ASSERT_TRUE(kv.reserve(a.seq, 1));
  kv.commit(a.seq, V{1});
  for (int i = 1; i < 22; ++i) {
    ASSERT_TRUE(kv.reserve(a.seq, 1));
    kv.commit(a.seq, V{int32_t(i)});
    kv.check_invariants();
  }
  // 22 tokens, next query p = 22: visible [0, 2) ∪ [15, 22]: logical blocks
  // 1 and 2 (tokens 4..11) are gone, block 3 (12..15) is partly visible.
  // Logical block 1 died after token 14 (p = 15: window [8, 15]), before
  // logical block 4 was taken at token 16, which therefore reused physical
  // block 1 (the free list is a stack); likewise block 2 died after token 18
  // and became logical block 5 at token 20.
  const V& t = kv.block_table(a.seq);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t, (V{0, -1, -1, 3, 1, 2}));
  EXPECT_EQ(kv.pool().n_used(), 4);
  // Logical block 3 dies after token 22 (p = 23: window [16, 23]) and comes
  // back as logical block 6 at token 24.
  for (int i = 22; i < 26; ++i) {
    ASSERT_TRUE(kv.reserve(a.seq, 1));
    kv.commit(a.seq, V{int32_t(i)});
  }
  EXPECT_EQ(kv.block_table(a.seq), (V{0, -1, -1, -1, 1, 2, 3}));
  const SeqId f = kv.fork(a.seq);  // forks share the live blocks only
  kv.check_invariants();
  kv.release(a.seq);
  kv.release(f);
  EXPECT_EQ(kv.pool().n_used(), 0);
  EXPECT_EQ(kv.live_cap(), 3 + 2 + 128);  // ceil(10/4) + 2 + ceil(512/4)
}

// --- the engine ---

// Chunking does not change a token's logits under a window (visibility and
// positions are functions of the text index only), and a window longer
// than the sequence is bit-identical to no window at all.
TEST(WindowEngine, ChunkingInvariantAndNoOpWhenWindowIsLong) {
  SKIP_WITHOUT_SHARED();
  auto m = stories();
  Engine e(m, EngineOptions{2});
  const int n = 300;
  const V toks = random_tokens(n, m->config().n_vocab, 7);
  for (KvType kt : {KvType::F32, KvType::Int8}) {
    KvCacheOptions kc;
    kc.type = kt;
    for (WindowPolicy w : {WindowPolicy::streaming(64, 4), WindowPolicy::streaming(40, 0), WindowPolicy::context_shift(96, 8)}) {
      SCOPED_TRACE(w.describe() + " " + to_string(kt));
      LocalSequence one(e, n, 16, kc, w), chunked(e, n, 16, kc, w);
      std::vector<float> a, b;
      for (int i = 0; i < n; ++i) {
        const auto& l = one.eval(&toks[size_t(i)], 1);
        a.insert(a.end(), l.begin(), l.end());
      }
      for (int i = 0; i < n;) {
        const int c = std::min(n - i, i % 2 ? 7 : 33);
        const auto& l = chunked.eval(&toks[size_t(i)], c, /*all_logits=*/true);
        b.insert(b.end(), l.begin(), l.end());
        i += c;
      }
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "chunking changed the logits";
    }
  }
  // Keys rotated at attention time instead of before storage: same floats.
  LocalSequence plain(e, n), windowed(e, n, 16, {}, WindowPolicy::streaming(n + 10, 4));
  const auto& x = plain.eval(toks, true);
  const auto& y = windowed.eval(toks, true);
  ASSERT_EQ(x.size(), y.size());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * 4));
}

// A model whose metadata declares a sliding window (Mistral style) gets it
// without any flag: its logits equal the original model's under an explicit
// native window, and differ from full attention once the window is passed.
TEST(WindowEngine, NativeSlidingWindowFromMetadataIsHonoured) {
  SKIP_WITHOUT_SHARED();
  const std::string src = test::shared("models/tiny-random/tiny-llama-f16.gguf");
  const auto in = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [k, v] : in->metadata()) w.set_value(k, v);
  const std::string arch = in->get_str("general.architecture");
  w.set_u32(arch + ".attention.sliding_window", 8);
  for (const GgufTensorInfo& t : in->tensors())
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  const std::string dst = test::temp_dir() + "/tiny-llama-swa8.gguf";
  w.write(dst);
  auto swa = Model::load(dst);
  auto orig = Model::load(src);
  ASSERT_EQ(swa->config().sliding_window, 8);
  Engine es(swa, EngineOptions{2}), eo(orig, EngineOptions{2});
  const V toks = random_tokens(40, orig->config().n_vocab, 11);
  LocalSequence a(es, 64), b(eo, 64, 16, {}, WindowPolicy::native(8)), full(eo, 64);
  const auto la = a.eval(toks, true), lb = b.eval(toks, true), lf = full.eval(toks, true);
  const size_t nv = size_t(orig->config().n_vocab);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4)) << "metadata window = explicit native window";
  EXPECT_EQ(0, std::memcmp(la.data(), lf.data(), 8 * nv * 4)) << "the first 8 tokens see everything either way";
  EXPECT_NE(0, std::memcmp(la.data() + 20 * nv, lf.data() + 20 * nv, nv * 4)) << "token 20 sees only 13..20";
  EXPECT_LE(a.peak_blocks(), 3) << "blocks behind the window are recycled";
  // The engine never resolves a policy itself: a chunk that lacks the
  // model's window is refused rather than silently given full attention.
  BlockStorage st(KvLayout{swa->config().n_layers, swa->config().n_kv_heads, swa->config().head_dim, 16}, 4);
  const std::vector<int32_t> table = {0, 1, 2, 3};
  SeqChunk ch;
  ch.block_table = table.data();
  ch.tokens = toks.data();
  ch.n_tokens = 4;
  std::vector<float> lg;
  EXPECT_THROW(es.forward({ch}, st.view(), lg), std::invalid_argument);
  const WindowPolicy none;
  ch.window = &none;
  EXPECT_THROW(es.forward({ch}, st.view(), lg), std::invalid_argument);
  const WindowPolicy native = WindowPolicy{}.in_force(swa->config().sliding_window);
  ch.window = &native;
  es.forward({ch}, st.view(), lg);
  EXPECT_EQ(0, std::memcmp(lg.data(), la.data() + 3 * nv, nv * 4)) << "the resolved policy: the same logits";
}

// One formula bounds a windowed sequence's blocks: the manager's live cap,
// the paged pool's sizing and LocalSequence's storage all use it.
TEST(WindowPolicy, BlockCapIsOneFormula) {
  EXPECT_EQ(window_block_cap(WindowPolicy{}, 16, 512), INT64_MAX);
  // 2 sinks + 8 window = 10 tokens = 3 blocks of 4, 2 edge blocks, 16 step tokens = 4 blocks.
  EXPECT_EQ(window_block_cap(WindowPolicy::streaming(8, 2), 4, 16), 3 + 2 + 4);
  EXPECT_EQ(window_block_cap(WindowPolicy::native(16), 16, 0), 1 + 2 + 1);  // a step appends at least one token
  EXPECT_EQ(window_block_cap(WindowPolicy::context_shift(100, 4), 16, 64), 7 + 2 + 4);
  for (const WindowPolicy& w : {WindowPolicy{}, WindowPolicy::streaming(8, 2), WindowPolicy::context_shift(40, 4)}) {
    KvManagerOptions o = KvManagerOptions::basic(4, true);
    o.window = w;
    o.max_step_tokens = 16;
    const KvManager m(64, o);
    EXPECT_EQ(m.live_cap(), window_block_cap(w, 4, 16)) << w.describe();
  }
}

// 10k decode steps at constant KV memory, in LocalSequence and in the shared
// pool, with identical logits in both.
TEST(WindowEngine, ConstantMemoryOverTenThousandSteps) {
  SKIP_WITHOUT_SHARED();
  auto m = stories();
  Engine e(m, EngineOptions{2});
  const int steps = 10000, bs = 16;
  const WindowPolicy w = WindowPolicy::streaming(64, 4);
  LocalSequence local(e, steps + 1, bs, {}, w);
  PagedEngineOptions po;
  po.block_size = bs;
  po.n_blocks = 16;  // far fewer than 10k tokens need without a window (626)
  po.max_ctx = steps + 1;
  po.window = w;
  po.max_step_tokens = 16;
  PagedEngine pe(e, po);
  const auto a = pe.add(V{1});
  int32_t t = 1;
  int peak_used = 0, used_at_1k = 0;
  StepResult r = pe.step({{a.seq, V{t}}});
  local.eval(&t, 1);
  for (int i = 1; i < steps; ++i) {
    t = int32_t(3 + (i * 7919) % (m->config().n_vocab - 3));
    r = pe.step({{a.seq, std::span<const int32_t>(&t, 1)}});
    ASSERT_TRUE(r.ok) << "step " << i;
    const auto& l = local.eval(&t, 1);
    if (i % 997 == 0) {
      ASSERT_EQ(0, std::memcmp(l.data(), r.logits_of(0), l.size() * 4)) << "step " << i;
    }
    peak_used = std::max(peak_used, int(pe.kv().pool().n_used()));
    if (i == 1000) used_at_1k = int(pe.kv().pool().n_used());
    // Same phase within a block (1000 + 16 k): the same number of blocks.
    if (i > 1000 && (i - 1000) % bs == 0) {
      ASSERT_EQ(int(pe.kv().pool().n_used()), used_at_1k) << "step " << i;
    }
  }
  std::printf("[ window ] 10k steps: pool peak %d blocks, at 1k %d, at 10k %d; LocalSequence peak %d\n", peak_used,
              used_at_1k, int(pe.kv().pool().n_used()), local.peak_blocks());
  EXPECT_LE(peak_used, 7);  // sink block + 64 tokens over 5 blocks + the block being written
  EXPECT_LE(local.peak_blocks(), 7);
  pe.kv().check_invariants();
}

// Prefix caching under a window: a second sequence with the same long
// prompt reuses the cached blocks (those the window freed stay cached, keyed
// by their prefix), gets the first one's logits bit for bit, and both then
// decode identically while the pool stays bounded.
TEST(WindowEngine, PrefixCacheAndForkUnderAWindow) {
  SKIP_WITHOUT_SHARED();
  auto m = stories();
  Engine e(m, EngineOptions{2});
  for (KvType kt : {KvType::F32, KvType::Int8}) {
    SCOPED_TRACE(to_string(kt));
    PagedEngineOptions po;
    po.block_size = 16;
    po.n_blocks = 64;
    po.max_ctx = 4096;
    po.window = WindowPolicy::streaming(48, 4);
    po.max_step_tokens = 64;
    po.cache.type = kt;
    PagedEngine pe(e, po);
    const V prompt = random_tokens(200, m->config().n_vocab, 5);
    const auto a = pe.add(prompt);
    std::vector<std::vector<float>> la;
    for (size_t i = size_t(a.cached_tokens); i < prompt.size(); i += 64) {  // chunked prefill under the window
      const size_t n = std::min<size_t>(64, prompt.size() - i);
      StepResult r = pe.step({{a.seq, std::span<const int32_t>(&prompt[i], n)}});
      ASSERT_TRUE(r.ok);
      if (i + n == prompt.size()) la.emplace_back(r.logits_of(0), r.logits_of(0) + r.n_vocab);
    }
    pe.kv().check_invariants(true);
    const auto b = pe.add(prompt);
    EXPECT_GT(b.cached_tokens, 0);
    EXPECT_EQ(b.cached_tokens % 16, 0);
    std::vector<float> lb;
    for (size_t i = size_t(b.cached_tokens); i < prompt.size(); i += 64) {
      const size_t n = std::min<size_t>(64, prompt.size() - i);
      StepResult r = pe.step({{b.seq, std::span<const int32_t>(&prompt[i], n)}});
      ASSERT_TRUE(r.ok);
      if (i + n == prompt.size()) lb.assign(r.logits_of(0), r.logits_of(0) + r.n_vocab);
    }
    ASSERT_EQ(lb.size(), la[0].size());
    EXPECT_EQ(0, std::memcmp(lb.data(), la[0].data(), lb.size() * 4)) << "cached prefix under a window";
    const SeqId f = pe.fork(a.seq);
    for (int i = 0; i < 40; ++i) {
      const int32_t t = int32_t(3 + i * 11);
      StepResult r = pe.step({{a.seq, std::span<const int32_t>(&t, 1)}, {b.seq, std::span<const int32_t>(&t, 1)},
                              {f, std::span<const int32_t>(&t, 1)}});
      ASSERT_TRUE(r.ok);
      EXPECT_EQ(0, std::memcmp(r.logits_of(0), r.logits_of(1), size_t(r.n_vocab) * 4)) << i;
      EXPECT_EQ(0, std::memcmp(r.logits_of(0), r.logits_of(2), size_t(r.n_vocab) * 4)) << i;
    }
    pe.kv().check_invariants(true);
    EXPECT_LE(pe.kv().pool().n_used(), 3 * int(pe.kv().live_cap()));
    pe.release(a.seq);
    pe.release(b.seq);
    pe.release(f);
    EXPECT_EQ(pe.kv().pool().n_used(), 0);
  }
}

// 20 windows' worth of text through 4 sinks + a 128-token window: the last
// segment's perplexity stays near the full-context one (fluent), whereas
// positions past the training context (the naive window) degrade.
TEST(WindowEngine, FluentAfterTwentyWindows) {
  SKIP_WITHOUT_SHARED();
  auto m = stories();
  auto tok = Tokenizer::create(m->vocab());
  Engine e(m, EngineOptions{2});
  const std::vector<int> one = tok->encode(test::read_file(test::shared("eval/stories-eval.txt")), true);
  std::vector<int> toks = one;
  toks.insert(toks.end(), one.begin() + 1, one.end());
  ASSERT_GE(toks.size(), 20u * 128);
  toks.resize(20 * 128 + 1);
  StreamEvalOptions o;
  o.segment = 640;
  o.window = WindowPolicy::streaming(128, 4);
  const StreamEvalResult s = stream_eval(e, toks, o);
  o.window = WindowPolicy::streaming(128, 0);
  const StreamEvalResult plain = stream_eval(e, toks, o);
  o.window = WindowPolicy::native(128);
  const StreamEvalResult text_pos = stream_eval(e, toks, o);
  o.window = WindowPolicy::streaming(128, 4, /*text_positions=*/true);
  const StreamEvalResult naive = stream_eval(e, toks, o);
  std::printf("[ window ] 20 windows: sinks+window PPL %.3f (last segment %.3f, peak %d blocks); window %.3f; "
              "window at text positions %.3f; sinks+window at text positions %.3f\n",
              s.ppl, s.segment_ppl.back().second, s.peak_blocks, plain.ppl, text_pos.ppl, naive.ppl);
  EXPECT_LT(s.segment_ppl.back().second, 8.0) << "PPL at ctx 512 is 4.88";
  EXPECT_LE(s.peak_blocks, 13);
  // RoPE scores depend on query-key distance only: a window without sinks
  // is the same at cache or text positions (up to float rounding of angles).
  EXPECT_NEAR(text_pos.ppl, plain.ppl, 1e-3 * plain.ppl);
  // Sinks left at their text positions sit ever farther from the query.
  EXPECT_GT(naive.ppl, s.ppl);
}

}  // namespace
