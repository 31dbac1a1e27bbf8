// The hybrid KV cache with a model: Gemma 2 and Gemma 3 shaped models made
// at test time (small dims, real layer patterns, windows of 16 and 32
// tokens, context 256) give bit-identical logits with the hybrid cache and
// with every layer at full size, alone and in the shared pool, batched,
// chunked and after a prefix hit; each windowed table holds its bound, and a
// sequence's pool use is the per-table sum.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "engine/local_sequence.h"
#include "engine/paged_engine.h"
#include "kv/capacity.h"
#include "model/model.h"
#include "engine_test_util.h"
#include "test_util.h"
#include "tools/make_model.h"

using namespace kvs;
using V = std::vector<int32_t>;

namespace {

struct Shape {
  const char* arch;
  int layers, window;
};

std::shared_ptr<const Model> make(const Shape& s) {
  MakeModelOptions o;
  o.out = test::temp_dir() + "/hybrid-" + s.arch + "-" + std::to_string(s.window) + ".gguf";
  o.arch = s.arch;
  o.dim = 64;
  o.n_layers = s.layers;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.head_dim = 32;
  o.n_ctx = 256;
  o.window = s.window;
  o.type = GgmlType::F16;
  o.progress = false;
  make_random_model(o);
  return Model::load(o.out);
}

using test::random_tokens;

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Hybrid : public ::testing::TestWithParam<Shape> {};

TEST_P(Hybrid, LocalSequenceMatchesFullSizeKvAndHoldsTheBound) {
  const Shape s = GetParam();
  auto m = make(s);
  Engine e(m, EngineOptions{2});
  const V toks = random_tokens(230, m->config().n_vocab, 3);
  for (KvType type : {KvType::F32, KvType::F16, KvType::Int8}) {
    SCOPED_TRACE(to_string(type));
    KvCacheOptions full, hybrid;
    full.type = hybrid.type = type;
    full.hybrid = false;
    LocalSequence a(e, 256, 16, full), b(e, 256, 16, hybrid);
    ASSERT_EQ(a.n_tables(), 1);
    ASSERT_GT(b.n_tables(), 1);
    const std::vector<float> la = a.eval(toks, true);
    std::vector<float> lb;
    for (int i = 0; i < 230;) {  // the hybrid one chunked and decoded
      const int n = i < 100 ? 37 : 1;
      const auto& l = b.eval(toks.data() + i, std::min(n, 230 - i), true);
      lb.insert(lb.end(), l.begin(), l.end());
      i += n;
    }
    EXPECT_TRUE(same(la, lb)) << "hybrid cache changed the logits";
    // Each windowed table holds at most ceil(W / 16) + 1 blocks between
    // steps; the full table every block; the storage is their caps' sum.
    const KvLayout& l = b.layout();
    int live = 0;
    for (int t = 0; t < b.n_tables(); ++t) {
      const int w = l.groups.tables[size_t(t)].window;
      const int cap = w == 0 ? 15 : (w + 15) / 16 + 1;  // 230 tokens: 15 blocks
      EXPECT_LE(b.live_blocks(t), cap) << "table " << t;
      if (w == 0) EXPECT_EQ(b.live_blocks(t), 15);
      live += b.live_blocks(t);
    }
    EXPECT_EQ(live, b.live_blocks());
    EXPECT_EQ(a.live_blocks(), 15);
    // Bytes: the full-size cache keeps 15 blocks of every layer.
    EXPECT_LT(int64_t(b.live_blocks()) * b.block_bytes(), int64_t(a.live_blocks()) * a.block_bytes());
    // Saved and restored, it goes on identically.
    LocalSequence c(e, 256, 16, hybrid);
    c.load_state(b.save_state());
    LocalSequence d(e, 256, 16, full);
    d.load_state(a.save_state());
    EXPECT_TRUE(same(c.eval(V{5, 6}, true), d.eval(V{5, 6}, true)));
    EXPECT_THROW(d.load_state(b.save_state()), std::invalid_argument);  // another layout
  }
}

// A sequence policy on top of the layers' own windows (--kv-window with
// --kv-sinks: StreamingLLM's sinks + window, keys rotated at attention
// time): each table frees what either hides, and the logits still equal the
// full-size cache's under the same policy.
TEST_P(Hybrid, SequencePolicyCombinesWithLayerWindows) {
  const Shape s = GetParam();
  auto m = make(s);
  Engine e(m, EngineOptions{2});
  const V toks = random_tokens(230, m->config().n_vocab, 5);
  for (const WindowPolicy& w : {WindowPolicy::streaming(48, 4), WindowPolicy::context_shift(96, 8)}) {
    SCOPED_TRACE(w.describe());
    KvCacheOptions full;
    full.hybrid = false;
    LocalSequence a(e, 256, 16, full, w), b(e, 256, 16, {}, w);
    ASSERT_GT(b.n_tables(), 1);
    // In chunks shorter than the prompt, so that blocks free between them.
    const int n = int(toks.size());
    EXPECT_TRUE(same(a.eval(toks.data(), n, true, 64), b.eval(toks.data(), n, true, 64)));
    EXPECT_LT(b.peak_blocks() * b.block_bytes(), a.peak_blocks() * a.block_bytes());
  }
}

TEST_P(Hybrid, PagedSoloBatchedChunkedAndPrefixHitAgree) {
  const Shape s = GetParam();
  auto m = make(s);
  Engine e(m, EngineOptions{2});
  const int nv = m->config().n_vocab;
  const V prompt = random_tokens(150, nv, 9);
  // Reference: the full-size cache, one sequence alone, one prefill.
  LocalSequence ref(e, 256, 16, KvCacheOptions{.hybrid = false});
  const std::vector<float> want = ref.eval(prompt, true);
  const V decode = random_tokens(24, nv, 11);  // past a window edge and a block edge
  std::vector<std::vector<float>> want_next;
  for (int32_t t : decode) {
    const auto& l = ref.eval(V{t});
    want_next.emplace_back(l.begin(), l.end());
  }
  PagedEngineOptions po;
  po.n_blocks = 120;
  po.max_ctx = 256;
  po.max_step_tokens = 64;
  PagedEngine pe(e, po);
  ASSERT_GT(pe.kv().n_tables(), 1);
  // Chunked prefill in a batch with another sequence.
  const auto a = pe.add(prompt);
  const auto other = pe.add(random_tokens(40, nv, 10));
  std::vector<float> got;
  for (int i = 0; i < 150; i += 64) {
    const int n = std::min(64, 150 - i);
    std::vector<SeqStep> items = {{a.seq, std::span<const int32_t>(&prompt[size_t(i)], size_t(n)), true}};
    const V tail = random_tokens(3, nv, 20 + i);
    if (i < 128) items.push_back({other.seq, std::span<const int32_t>(tail)});
    const StepResult r = pe.step(items);
    ASSERT_TRUE(r.ok);
    got.insert(got.end(), r.logits_of(0, 0), r.logits_of(0, 0) + size_t(n) * nv);
    pe.kv().check_invariants(true);
  }
  EXPECT_TRUE(same(got, want)) << "paged hybrid prefill differs from the full-size cache";
  // After the prefix hit: a second sequence with the same prompt.
  const auto b = pe.add(prompt);
  EXPECT_EQ(b.cached_tokens, 144);
  pe.kv().check_invariants(true);
  const StepResult rb = pe.step({{b.seq, std::span<const int32_t>(&prompt[144], 6)}});
  ASSERT_TRUE(rb.ok);
  EXPECT_EQ(0, std::memcmp(rb.logits_of(0), &want[size_t(149) * nv], size_t(nv) * sizeof(float)));
  // Decode both, and a fork of the first: each equals the reference.
  const SeqId f = pe.fork(a.seq);
  for (size_t k = 0; k < decode.size(); ++k) {
    const std::span<const int32_t> t(&decode[k], 1);
    const StepResult d = pe.step({{a.seq, t}, {b.seq, t}, {f, t}});
    ASSERT_TRUE(d.ok);
    for (size_t i = 0; i < 3; ++i)
      ASSERT_EQ(0, std::memcmp(d.logits_of(i), want_next[k].data(), size_t(nv) * sizeof(float))) << k << " " << i;
    pe.kv().check_invariants(true);
  }
  // Pool use: the windowed tables hold their windows only.
  const KvStats st = pe.stats().kv;
  const KvLayout& l = pe.layout();
  for (int t = 0; t < pe.kv().n_tables(); ++t) {
    const int w = l.groups.tables[size_t(t)].window;
    int64_t held = 0;
    for (int32_t blk : pe.kv().block_table(a.seq, t)) held += blk >= 0;
    EXPECT_LE(held, w == 0 ? 11 : (w + 15) / 16 + 1) << "table " << t;  // 174 tokens
  }
  EXPECT_EQ(st.used_blocks, std::accumulate(st.table_blocks.begin(), st.table_blocks.end(), int64_t(0)));
  for (SeqId q : {a.seq, b.seq, f, other.seq}) pe.release(q);
  EXPECT_EQ(pe.kv().pool().n_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Hybrid,
                         // gpt-oss: windows on even layers as gemma2, plus its learned sinks
                         // beside a policy's --kv-sinks (docs/KV.md), YaRN and MXFP4 experts.
                         ::testing::Values(Shape{"gemma2", 4, 16}, Shape{"gemma3", 6, 32}, Shape{"gpt-oss", 4, 16}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           std::string s = i.param.arch;
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

// What the pool and the planner rely on: a Gemma 3 shaped cache at 32k
// tokens needs a fraction of the full-size blocks (bytes: kv/capacity.h).
TEST(HybridSizing, SequenceBlockCapIsThePerTableSum) {
  KvGroups g = KvGroups::by_window({1024, 1024, 1024, 1024, 1024, 0});
  const std::vector<TableWindow> tw = table_windows(WindowPolicy{}, g);
  ASSERT_EQ(tw.size(), 6u);
  // Full table: 2048 blocks; each windowed table: 64 + 2 + 32 (a 512-token step).
  EXPECT_EQ(sequence_block_cap(tw, 32768, 16, 512), 2048 + 5 * 98);
  // One table of all six layers (blocks six times the size): 2048.
  EXPECT_EQ(sequence_block_cap(table_windows(WindowPolicy{}, KvGroups::uniform(6)), 32768, 16, 512), 2048);
}

// The Gemma 3 27B shape (62 layers, every sixth global, 1,024-token
// windows; 16 KV heads x 128, f16) in the pool itself: one sequence grows to
// 32k tokens in 512-token steps; the KV manager's blocks per table, at 8k
// and 32k, against one table of every layer at full size. The bytes are the
// blocks times the storage layout's block bytes, and they equal
// kv/capacity.h's sequence_kv_bytes (what `kvserve plan` prints).
TEST(HybridSizing, Gemma3ShapeInThePoolAt32k) {
  std::vector<int> windows;
  for (int l = 0; l < 62; ++l) windows.push_back((l + 1) % 6 == 0 ? 0 : 1024);
  KvLayout grouped{62, 16, 128, 16};
  grouped.type = KvType::F16;
  grouped.groups = KvGroups::by_window(windows);
  KvLayout full = grouped;
  full.groups = KvGroups::uniform(62);
  ASSERT_EQ(grouped.n_tables(), 7);
  ASSERT_EQ(grouped.slots(), 10);
  const auto run = [](const KvLayout& l, std::vector<int64_t>& at8k, std::vector<int64_t>& at32k, int64_t& peak) {
    KvManagerOptions o = KvManagerOptions::basic(16, false);
    o.table_windows = l.groups.table_windows();
    o.max_step_tokens = 512;
    KvManager m(4096, o);
    const SeqAdmission a = m.add_sequence(V{1}, {});
    const V step(512, 7);
    peak = 0;
    for (int i = 0; i < 64; ++i) {
      ASSERT_TRUE(m.reserve(a.seq, 512));
      peak = std::max<int64_t>(peak, m.pool().n_used());
      m.commit(a.seq, step);
      if (m.num_tokens(a.seq) == 8192) at8k = m.stats().table_blocks;
    }
    at32k = m.stats().table_blocks;
    m.check_invariants();
  };
  std::vector<int64_t> g8, g32, f8, f32;
  int64_t gpeak = 0, fpeak = 0;
  run(grouped, g8, g32, gpeak);
  run(full, f8, f32, fpeak);
  // Between steps each windowed table holds the 64 blocks its window
  // covers (32,768 and 8,192 are block-aligned); during a step at most its
  // cap of ceil(1024 / 16) + 2 + ceil(512 / 16) = 98.
  EXPECT_EQ(g32, (std::vector<int64_t>{2048, 64, 64, 64, 64, 64, 64}));
  EXPECT_EQ(g8, (std::vector<int64_t>{512, 64, 64, 64, 64, 64, 64}));
  EXPECT_EQ(f32, (std::vector<int64_t>{2048}));
  EXPECT_LE(gpeak, 2048 + 6 * 98);
  const auto bytes = [](const std::vector<int64_t>& blocks, const KvLayout& l) {
    return std::accumulate(blocks.begin(), blocks.end(), int64_t(0)) * int64_t(l.block_bytes());
  };
  const int64_t hybrid32 = bytes(g32, grouped), full32 = bytes(f32, full);
  EXPECT_EQ(full32, int64_t(2048) * 16 * 62 * 8192);
  EXPECT_GE(double(full32) / double(hybrid32), 4.0) << "the issue's bar: >= 4x fewer KV bytes at 32k";
  const std::vector<KvTableShape> shapes = kv_table_shapes(windows, 62);
  // Block-aligned contexts: the plan's ceil(W / B) + 1 is one block more
  // per windowed table than the pool holds here.
  EXPECT_EQ(uint64_t(hybrid32) + 6 * uint64_t(grouped.block_bytes()), sequence_kv_bytes(shapes, 32768, 16, 8192, 0));
  std::printf("[ hybrid ] Gemma 3 27B shape, f16, one sequence: 8k: %lld blocks of 10 layers = %.3f GiB hybrid vs "
              "%.3f GiB full (%.2fx); 32k: %lld blocks = %.3f GiB vs %.3f GiB (%.2fx); peak in a step %lld blocks\n",
              (long long)std::accumulate(g8.begin(), g8.end(), int64_t(0)), bytes(g8, grouped) / 1073741824.0,
              bytes(f8, full) / 1073741824.0, double(bytes(f8, full)) / double(bytes(g8, grouped)),
              (long long)std::accumulate(g32.begin(), g32.end(), int64_t(0)), hybrid32 / 1073741824.0,
              full32 / 1073741824.0, double(full32) / double(hybrid32), (long long)gpeak);
}

}  // namespace
