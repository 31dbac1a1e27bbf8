// Paged attention (through a block table, scattered blocks) against a
// double-precision contiguous reference, for MHA, GQA and MQA shapes, every
// KV type, windows, sinks and rotated keys; query blocks and chunkings
// against one token at a time (bit for bit); the tile kernels of every ISA
// against the scalar one (bit for bit) and a double-precision softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>

#include "kernels/attention.h"
#include "kernels/cpu.h"
#include "kernels/exp_poly.h"
#include "kernels/flash_attention.h"
#include "kernels/kv_codec.h"
#include "kernels/ops.h"
#include "kv/block_storage.h"
#include "kv/window_policy.h"

using namespace kvs;

namespace {

class AttentionIsa : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { set_isa_override(GetParam()); }
  void TearDown() override { clear_isa_override(); }
};

TEST_P(AttentionIsa, PagedMatchesContiguousReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Shape { int nh, nkv, hd, bs, n_ctx; };
  for (Shape sh : {Shape{4, 4, 8, 16, 1}, Shape{8, 2, 32, 16, 45}, Shape{8, 1, 16, 1, 33}, Shape{6, 3, 24, 5, 70}}) {
    SCOPED_TRACE(::testing::Message() << sh.nh << "/" << sh.nkv << " hd " << sh.hd << " bs " << sh.bs << " ctx " << sh.n_ctx);
    KvLayout lay{2, sh.nkv, sh.hd, sh.bs};
    const int n_blocks = (sh.n_ctx + sh.bs - 1) / sh.bs;
    BlockStorage st(lay, n_blocks * 2 + 3);
    // Scattered, reversed physical blocks: the kernel must follow the table.
    std::vector<int32_t> table(n_blocks);
    for (int i = 0; i < n_blocks; ++i) table[i] = int32_t(n_blocks * 2 + 2 - 2 * i);
    const int layer = 1;
    const size_t row = size_t(sh.nkv) * sh.hd;
    std::vector<float> k(sh.n_ctx * row), v(sh.n_ctx * row), q(sh.nh * sh.hd);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    for (int t = 0; t < sh.n_ctx; ++t) {
      std::copy_n(&k[t * row], row, st.view().k(table[t / sh.bs], layer, t % sh.bs));
      std::copy_n(&v[t * row], row, st.view().v(table[t / sh.bs], layer, t % sh.bs));
    }
    // Without and with learned sinks (one logit per head; some dominate).
    std::vector<float> sinks(size_t(sh.nh));
    for (int h = 0; h < sh.nh; ++h) sinks[size_t(h)] = h % 2 ? 4.f + nd(rng) : nd(rng);
    for (const float* sk : {static_cast<const float*>(nullptr), static_cast<const float*>(sinks.data())}) {
      AttnShape s{sh.nh, sh.nkv, sh.hd, 1.0f / std::sqrt(float(sh.hd))};
      s.sinks = sk;
      std::vector<float> out(sh.nh * sh.hd, -7.f), ref(sh.nh * sh.hd);
      std::vector<float> scratch(attention_scratch_floats(sh.nh / sh.nkv, sh.hd));
      const AttnSeq as{table.data(), sh.n_ctx, sh.n_ctx, nullptr, nullptr};
      for (int g = 0; g < sh.nkv; ++g) attention_group(q.data(), st.view(), layer, as, g, s, out.data(), scratch.data());
      attention_reference(q.data(), k.data(), v.data(), sh.n_ctx, s, ref.data());
      for (size_t i = 0; i < out.size(); ++i)
        EXPECT_NEAR(out[i], ref[i], 2e-5 * (1 + std::fabs(ref[i]))) << i << (sk ? " sinks" : "");
    }
  }
}

// A query block (T consecutive tokens sharing each loaded K/V tile) gives
// each token exactly the bits of its own attention_group call: f32 and f16
// caches, GQA and MQA, head_dim 8 (masked) and 64 (tiled), contexts that
// end mid-block, blocks that start at the first token.
TEST_P(AttentionIsa, QueryBlockMatchesOneTokenAtATime) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Shape { int nh, nkv, hd, bs, n_ctx, T; KvType type; };
  for (Shape sh : {Shape{8, 2, 64, 16, 45, 7, KvType::F32}, Shape{8, 1, 8, 4, 23, 23, KvType::F32},
                   Shape{6, 3, 64, 16, 37, 16, KvType::F16}, Shape{4, 4, 16, 8, 9, 2, KvType::F32}}) {
    SCOPED_TRACE(::testing::Message() << sh.nh << "/" << sh.nkv << " hd " << sh.hd << " ctx " << sh.n_ctx << " T " << sh.T);
    KvLayout lay{1, sh.nkv, sh.hd, sh.bs};
    lay.type = sh.type;
    const int n_blocks = (sh.n_ctx + sh.bs - 1) / sh.bs;
    BlockStorage st(lay, n_blocks + 2);
    std::vector<int32_t> table(n_blocks);
    for (int i = 0; i < n_blocks; ++i) table[i] = int32_t(n_blocks + 1 - i);
    const size_t row = size_t(sh.nkv) * sh.hd, qdim = size_t(sh.nh) * sh.hd;
    std::vector<float> k(sh.n_ctx * row), v(sh.n_ctx * row), q(sh.T * qdim);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    for (int t = 0; t < sh.n_ctx; ++t)
      kvc::store_rows(st.view(), table[t / sh.bs], 0, t % sh.bs, 1, &k[t * row], &v[t * row]);
    std::vector<float> sinks(size_t(sh.nh));
    for (int h = 0; h < sh.nh; ++h) sinks[size_t(h)] = h % 2 ? 3.f : -1.f + 0.5f * float(h);
    // Plain; then gpt-oss's learned sinks with a layer window shorter than the context.
    for (bool gptoss : {false, true}) {
      AttnShape s{sh.nh, sh.nkv, sh.hd, 1.0f / std::sqrt(float(sh.hd))};
      if (gptoss) s.sinks = sinks.data();
      const int window = gptoss ? 11 : 0;
      const int r = sh.nh / sh.nkv;
      std::vector<float> blk(sh.T * qdim, -7.f), one(sh.T * qdim, -9.f);
      std::vector<float> scratch(attention_scratch_floats(r * sh.T, sh.hd));
      AttnSeq last{table.data(), sh.n_ctx, sh.n_ctx, nullptr, nullptr};
      last.window = window;
      for (int g = 0; g < sh.nkv; ++g)
        attention_group_block(q.data(), qdim, sh.T, st.view(), 0, last, g, s, blk.data(), qdim, scratch.data());
      for (int i = 0; i < sh.T; ++i) {
        const int ctx = sh.n_ctx - (sh.T - 1 - i);
        AttnSeq as{table.data(), ctx, ctx, nullptr, nullptr};
        as.window = window;
        for (int g = 0; g < sh.nkv; ++g)
          attention_group(&q[i * qdim], st.view(), 0, as, g, s, &one[i * qdim], scratch.data());
      }
      ASSERT_EQ(0, std::memcmp(blk.data(), one.data(), blk.size() * 4)) << (gptoss ? "sinks + window" : "plain");
    }
  }
}

// --- the tiled kernel through the block table, every KV type ---------------

// One sequence's K/V in a pool of kPoolBlocks blocks under a random block
// table (so block offsets are large and scattered).
constexpr int kPoolBlocks = 32768;

struct PagedSeq {
  KvLayout lay;
  std::unique_ptr<BlockStorage> st;
  std::vector<int32_t> table;
  int n = 0;
  size_t row = 0;
  std::vector<float> k, v;    // [n, kvdim] as written (a quantized cache's own rows)
  std::vector<float> kd, vd;  // [n, kvdim] as the cache gives stored rows back
  int group() const { return lay.quantized() ? lay.group_tokens : 1; }
  // Stored rows a token with context ctx reads from the cache (the engine's rule).
  int n_stored(int ctx) const { return lay.quantized() ? (ctx - 1) / group() * group() : ctx; }
  AttnSeq seq(int ctx) const {
    const int ns = n_stored(ctx);
    return AttnSeq{table.data(), ctx, ns, k.data() + size_t(ns) * row, v.data() + size_t(ns) * row};
  }
};

PagedSeq make_paged(const KvLayout& lay, int n, unsigned seed) {
  PagedSeq ps;
  ps.lay = lay;
  ps.n = n;
  ps.row = lay.row_floats();
  ps.st = std::make_unique<BlockStorage>(lay, kPoolBlocks);
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(kPoolBlocks);
  for (int i = 0; i < kPoolBlocks; ++i) ids[size_t(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  ps.table.assign(ids.begin(), ids.begin() + (n + lay.block_size - 1) / lay.block_size);
  std::normal_distribution<float> nd(0.f, 1.f);
  ps.k.resize(size_t(n) * ps.row);
  ps.v.resize(ps.k.size());
  for (auto& x : ps.k) x = 1.5f * nd(rng);
  for (auto& x : ps.v) x = nd(rng);
  const KvStorage& kv = ps.st->view();
  const int bs = lay.block_size, G = ps.group(), stored = lay.quantized() ? n / G * G : n;
  for (int p = 0; p < stored; p += G) {
    const size_t o = size_t(p) * ps.row;
    if (lay.quantized()) kvc::store_group(kv, ps.table[size_t(p / bs)], 0, p % bs, &ps.k[o], &ps.v[o]);
    else kvc::store_rows(kv, ps.table[size_t(p / bs)], 0, p % bs, 1, &ps.k[o], &ps.v[o]);
  }
  ps.kd = ps.k;
  ps.vd = ps.v;
  for (int p = 0; p < stored; ++p)
    for (int g = 0; g < lay.n_kv_heads; ++g) {
      const size_t o = size_t(p) * ps.row + size_t(g) * lay.head_dim;
      kvc::load_k(kv, ps.table[size_t(p / bs)], 0, g, p % bs, 1, &ps.kd[o]);
      kvc::load_v(kv, ps.table[size_t(p / bs)], 0, g, p % bs, 1, &ps.vd[o]);
    }
  return ps;
}

// What a token with context ctx should get: double-precision softmax over
// its keys (stored rows as the cache returns them, own rows as written).
std::vector<float> reference_for(const PagedSeq& ps, const float* q, int ctx, const AttnShape& s) {
  const int ns = ps.n_stored(ctx);
  std::vector<float> k(size_t(ctx) * ps.row), v(k.size()), out(size_t(s.n_heads) * s.head_dim);
  for (int t = 0; t < ctx; ++t) {
    const size_t o = size_t(t) * ps.row;
    std::copy_n((t < ns ? ps.kd : ps.k).data() + o, ps.row, &k[o]);
    std::copy_n((t < ns ? ps.vd : ps.v).data() + o, ps.row, &v[o]);
  }
  attention_reference(q, k.data(), v.data(), ctx, s, out.data());
  return out;
}

// Attention of tokens [0, n) computed chunk by chunk, each chunk in query
// blocks of at most tmax tokens that stay inside one token group (the
// engine's plan): out [n, n_heads * head_dim].
std::vector<float> run_chunked(const PagedSeq& ps, const std::vector<float>& q, const AttnShape& s, int chunk,
                               int tmax) {
  const size_t qdim = size_t(s.n_heads) * s.head_dim;
  std::vector<float> out(size_t(ps.n) * qdim, -7.f);
  std::vector<float> scratch(attention_scratch_floats(s.n_heads / s.n_kv_heads * tmax, s.head_dim, s.bf16));
  for (int c0 = 0; c0 < ps.n; c0 += chunk) {
    const int c1 = std::min(ps.n, c0 + chunk);
    for (int p = c0; p < c1;) {
      const int T = std::min({tmax, c1 - p, ps.group() - p % ps.group()});
      const AttnSeq as = ps.seq(p + T);  // the block's last token
      for (int g = 0; g < s.n_kv_heads; ++g)
        attention_group_block(&q[size_t(p) * qdim], qdim, T, ps.st->view(), 0, as, g, s, &out[size_t(p) * qdim],
                              qdim, scratch.data());
      p += T;
    }
  }
  return out;
}

struct TypeCase {
  KvType type;
  KeyScale ks;
};
const TypeCase kTypes[] = {{KvType::F32, KeyScale::Channel},  {KvType::F16, KeyScale::Channel},
                           {KvType::BF16, KeyScale::Channel}, {KvType::Int8, KeyScale::Channel},
                           {KvType::Int4, KeyScale::Channel}, {KvType::Int8, KeyScale::Token},
                           {KvType::Int4, KeyScale::Token}};

// n tokens of one layer's K/V in a `tc` cache of block size bs and token
// group G, under a random block table.
PagedSeq paged_case(int nkv, int hd, int bs, int G, int n, TypeCase tc) {
  KvLayout lay{1, nkv, hd, bs};
  lay.type = tc.type;
  lay.key_scale = tc.ks;
  lay.group_tokens = G;
  return make_paged(lay, n, 31 + hd);
}

std::vector<float> random_queries(size_t count) {
  std::vector<float> q(count);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : q) x = nd(rng);
  return q;
}

// Query blocks of each size in Ts over the whole prompt, and chunks of each
// size in chunks (blocks of 16), give exactly `one`'s bits.
void expect_chunkings_give(const PagedSeq& ps, const std::vector<float>& q, const AttnShape& s,
                           const std::vector<float>& one, const std::vector<int>& Ts, const std::vector<int>& chunks) {
  std::vector<std::pair<int, int>> runs;  // (chunk, tmax)
  for (int T : Ts) runs.push_back({ps.n, T});
  for (int c : chunks) runs.push_back({c, 16});
  for (auto [chunk, tmax] : runs)
    ASSERT_EQ(0, std::memcmp(run_chunked(ps, q, s, chunk, tmax).data(), one.data(), one.size() * 4))
        << "chunk " << chunk << ", T " << tmax << ": bits differ from one token at a time";
}

// Every KV type, GQA (hd 32: the generic kernel) and MQA (hd 64: the
// specialized one), a length that is no multiple of 16: one token at a time
// matches the double reference, and every query block size T = 1..16 and
// every chunking gives exactly the one-at-a-time bits.
TEST_P(AttentionIsa, TiledMatchesReferenceAndIgnoresChunkingAndBlockSize) {
  struct Shape { int nh, nkv, hd, bs, G, n; };
  for (Shape sh : {Shape{8, 2, 32, 4, 4, 75}, Shape{4, 1, 64, 8, 8, 43}}) {
    for (TypeCase tc : kTypes) {
      SCOPED_TRACE(::testing::Message() << to_string(tc.type) << "/" << to_string(tc.ks) << " hd " << sh.hd);
      const PagedSeq ps = paged_case(sh.nkv, sh.hd, sh.bs, sh.G, sh.n, tc);
      const AttnShape s{sh.nh, sh.nkv, sh.hd, 1.0f / std::sqrt(float(sh.hd))};
      const size_t qdim = size_t(sh.nh) * sh.hd;
      const std::vector<float> q = random_queries(size_t(sh.n) * qdim);
      const std::vector<float> one = run_chunked(ps, q, s, 1, 1);
      for (int p = 0; p < sh.n; ++p) {
        const std::vector<float> ref = reference_for(ps, &q[size_t(p) * qdim], p + 1, s);
        for (size_t e = 0; e < qdim; ++e)
          ASSERT_NEAR(one[size_t(p) * qdim + e], ref[e], 2e-5 * (1 + std::fabs(ref[e]))) << "position " << p;
      }
      expect_chunkings_give(ps, q, s, one, {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {3, 16, 29});
    }
  }
}

// --- the bf16 variant (AMX-BF16 only) ---------------------------------------

std::string bf16_attention_missing() {
  return amx_bf16_active() ? std::string()
                           : "no AMX-BF16 here (amx_bf16 and avx512_bf16 in lscpu's flags, not lowered by KVS_ISA): "
                             "the bf16 attention cannot run";
}

// Every KV type; head sizes 16, 64, 80 (keys padded to 96) and 128; GQA and
// MQA; soft-capping and learned sinks; lengths that are no multiple of 16.
// One token at a time stays within bf16 rounding of the double reference
// (and is not the fp32 kernel's result: the tiles ran), and every query
// block size and chunking gives exactly its bits.
TEST(AttentionBf16, NearReferenceAndChunkingChangesNoBit) {
  if (const std::string why = bf16_attention_missing(); !why.empty()) GTEST_SKIP() << why;
  struct Shape { int nh, nkv, hd, bs, G, n; float cap; bool sinks; };
  for (Shape sh : {Shape{8, 2, 16, 4, 4, 75, 0.f, false}, Shape{4, 1, 64, 8, 8, 43, 0.f, true},
                   Shape{6, 3, 80, 16, 16, 37, 0.f, false}, Shape{2, 1, 128, 16, 16, 50, 3.f, false}}) {
    for (TypeCase tc : kTypes) {
      SCOPED_TRACE(::testing::Message() << to_string(tc.type) << "/" << to_string(tc.ks) << " hd " << sh.hd);
      const PagedSeq ps = paged_case(sh.nkv, sh.hd, sh.bs, sh.G, sh.n, tc);
      std::vector<float> sinks(size_t(sh.nh));
      for (int h = 0; h < sh.nh; ++h) sinks[size_t(h)] = h % 2 ? 3.f : -1.f;
      AttnShape s{sh.nh, sh.nkv, sh.hd, 1.0f / std::sqrt(float(sh.hd)), sh.cap, sh.sinks ? sinks.data() : nullptr};
      const size_t qdim = size_t(sh.nh) * sh.hd;
      const std::vector<float> q = random_queries(size_t(sh.n) * qdim);
      AttnShape s32 = s;
      s.bf16 = true;
      const std::vector<float> one = run_chunked(ps, q, s, 1, 1), fp32 = run_chunked(ps, q, s32, 1, 1);
      EXPECT_NE(0, std::memcmp(one.data(), fp32.data(), one.size() * 4)) << "the bf16 kernel did not run";
      double worst = 0;
      for (int p = 0; p < sh.n; ++p) {
        const std::vector<float> ref = reference_for(ps, &q[size_t(p) * qdim], p + 1, s);
        for (size_t e = 0; e < qdim; ++e)
          worst = std::max(worst, double(std::fabs(one[size_t(p) * qdim + e] - ref[e]) / (1 + std::fabs(ref[e]))));
      }
      EXPECT_LT(worst, 2e-2) << "further from the reference than bf16 rounding explains";
      expect_chunkings_give(ps, q, s, one, {2, 5, 16}, {3, 29});
    }
  }
}

// Contexts over kTileBatch tiles: the bf16 kernel takes them in several
// calls (its outputs leave the tile registers between them), and no bit
// depends on where those calls split a context or a query block.
TEST(AttentionBf16, ContextsOverSeveralCallsKeepTheirBits) {
  if (const std::string why = bf16_attention_missing(); !why.empty()) GTEST_SKIP() << why;
  const int nh = 4, nkv = 1, hd = 64, n = 2 * attn::kTileBatch * attn::kTile + 37;
  const PagedSeq ps = paged_case(nkv, hd, 16, 16, n, {KvType::F16, KeyScale::Channel});
  AttnShape s{nh, nkv, hd, 1.0f / std::sqrt(float(hd))};
  s.bf16 = true;
  const size_t qdim = size_t(nh) * hd;
  const std::vector<float> q = random_queries(size_t(n) * qdim);
  const std::vector<float> one = run_chunked(ps, q, s, 1, 1);
  for (int p : {attn::kTileBatch * attn::kTile - 1, attn::kTileBatch * attn::kTile + 5, n - 1}) {
    const std::vector<float> ref = reference_for(ps, &q[size_t(p) * qdim], p + 1, s);
    for (size_t e = 0; e < qdim; ++e)
      ASSERT_NEAR(one[size_t(p) * qdim + e], ref[e], 2e-2 * (1 + std::fabs(ref[e]))) << "position " << p;
  }
  expect_chunkings_give(ps, q, s, one, {16}, {29, 300});
}

// A key that only later tokens of a block see never reaches an earlier
// token, even when it holds inf (the masked updates leave the row as it was).
void expect_later_keys_never_reach_earlier(bool bf16) {
  const int nh = 4, nkv = 1, hd = 64, n = 37, T = 16;
  KvLayout lay{1, nkv, hd, 16};
  PagedSeq ps = make_paged(lay, n, 5);
  const KvStorage& kv = ps.st->view();
  for (int i = 0; i < hd; ++i) {
    kv.k(ps.table[2], 0, (n - 1) % 16)[i] = INFINITY;
    kv.v(ps.table[2], 0, (n - 1) % 16)[i] = INFINITY;
  }
  AttnShape s{nh, nkv, hd, 0.125f};
  s.bf16 = bf16;
  const size_t qdim = size_t(nh) * hd;
  std::vector<float> q(size_t(T) * qdim, 0.3f), blk(q.size()), lone(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(float(i));
  std::vector<float> scratch(attention_scratch_floats(nh * T, hd, bf16));
  attention_group_block(q.data(), qdim, T, kv, 0, ps.seq(n), 0, s, blk.data(), qdim, scratch.data());
  for (int i = 0; i < T - 1; ++i)
    attention_group(&q[size_t(i) * qdim], kv, 0, ps.seq(n - (T - 1 - i)), 0, s, &lone[size_t(i) * qdim],
                    scratch.data());
  for (size_t e = 0; e < (T - 1) * qdim; ++e) ASSERT_TRUE(std::isfinite(lone[e]));
  EXPECT_EQ(0, std::memcmp(blk.data(), lone.data(), (T - 1) * qdim * 4));
}

TEST_P(AttentionIsa, KeysOnlyLaterTokensSeeNeverReachEarlierOnes) { expect_later_keys_never_reach_earlier(false); }

// The same with bf16 tiles, where an unseen key's value meets p = 0 in a
// product (0 * inf): staged values are clamped to finite bf16.
TEST(AttentionBf16, KeysOnlyLaterTokensSeeNeverReachEarlierOnes) {
  if (const std::string why = bf16_attention_missing(); !why.empty()) GTEST_SKIP() << why;
  expect_later_keys_never_reach_earlier(true);
}

// Windows (hidden keys, their blocks freed), StreamingLLM sinks and keys
// rotated at attention time, f32 and quantized caches with own rows: the
// tiled kernel against the reference on the visible keys, rotated at the
// documented positions.
TEST_P(AttentionIsa, WindowsSinksAndRotationMatchReference) {
  const int nh = 4, nkv = 2, hd = 32, bs = 8, n = 100, n_rot = 32, half = n_rot / 2;
  std::vector<float> cs(size_t(n) * half), sn(cs.size());
  RopeTable rt;
  for (int i = 0; i < n; ++i) rt.compute(i, n_rot, 10000.f, &cs[size_t(i) * half], &sn[size_t(i) * half]);
  const AttnShape s{nh, nkv, hd, 1.0f / std::sqrt(float(hd))};
  for (TypeCase tc : {kTypes[0], kTypes[1], kTypes[3], kTypes[6]}) {
    KvLayout lay{1, nkv, hd, bs};
    lay.type = tc.type;
    lay.key_scale = tc.ks;
    lay.group_tokens = 4;
    const PagedSeq ps = make_paged(lay, n, 77);
    for (const WindowPolicy& w : {WindowPolicy::streaming(20, 3), WindowPolicy::native(33),
                                  WindowPolicy::streaming(40, 0), WindowPolicy::context_shift(48, 5)}) {
      for (int ctx : {1, 17, 50, 99, 100}) {
        SCOPED_TRACE(::testing::Message() << to_string(tc.type) << " " << w.describe() << " ctx " << ctx);
        const WindowView vw = w.view(ctx - 1);
        AttnSeq as = ps.seq(ctx);
        std::vector<int32_t> table = ps.table;  // blocks no key of this query lies in are gone
        for (int b = 0; b < int(table.size()); ++b)
          if (b * bs >= vw.sink_end && (b + 1) * bs <= vw.win_start) table[size_t(b)] = -1;
        as.block_table = table.data();
        as.sink_end = vw.sink_end;
        as.win_start = vw.win_start;
        if (w.rotates()) {
          as.rope_cos = cs.data(), as.rope_sin = sn.data(), as.shift = vw.shift, as.n_rot = n_rot;
        }
        std::vector<float> q(size_t(nh) * hd), out(q.size()), scratch(attention_scratch_floats(nh / nkv, hd));
        for (size_t i = 0; i < q.size(); ++i) q[i] = std::cos(0.7f * float(i) + float(ctx));
        for (int g = 0; g < nkv; ++g) attention_group(q.data(), ps.st->view(), 0, as, g, s, out.data(), scratch.data());
        std::vector<float> kr, vr;  // the visible keys as the reference sees them
        const int ns = ps.n_stored(ctx);
        for (int t = 0; t < ctx; ++t) {
          if (t >= vw.sink_end && t < vw.win_start) continue;
          const size_t o = size_t(t) * ps.row;
          std::vector<float> kk((t < ns ? ps.kd : ps.k).begin() + o, (t < ns ? ps.kd : ps.k).begin() + o + ps.row);
          const int pos = t < vw.sink_end ? t : t - vw.shift;
          if (w.rotates()) rope_apply(kk.data(), nkv, hd, n_rot, false, &cs[size_t(pos) * half], &sn[size_t(pos) * half]);
          kr.insert(kr.end(), kk.begin(), kk.end());
          vr.insert(vr.end(), (t < ns ? ps.vd : ps.v).begin() + o, (t < ns ? ps.vd : ps.v).begin() + o + ps.row);
        }
        ASSERT_EQ(int(kr.size() / ps.row), as.n_visible());
        std::vector<float> ref(q.size());
        attention_reference(q.data(), kr.data(), vr.data(), as.n_visible(), s, ref.data());
        for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-5 * (1 + std::fabs(ref[i]))) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, AttentionIsa, ::testing::Values(Isa::Scalar, Isa::Avx2, Isa::Avx512),
                         [](const auto& i) { return isa_name(i.param); });

// On f32, f16 and bf16 caches the tiles hold the same floats on every ISA,
// and every kernel runs the definition's operations: the same bits on every
// path, for a query block and for one token.
TEST(Attention, FloatCachesGiveTheSameBitsOnEveryIsa) {
  const int nh = 8, nkv = 2, hd = 64, n = 53, T = 16;
  const AttnShape s{nh, nkv, hd, 0.125f};
  const size_t qdim = size_t(nh) * hd;
  std::vector<float> q(size_t(T) * qdim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(1.3f * float(i));
  for (KvType t : {KvType::F32, KvType::F16, KvType::BF16}) {
    KvLayout lay{1, nkv, hd, 16};
    lay.type = t;
    const PagedSeq ps = make_paged(lay, n, 9);
    std::vector<std::vector<float>> outs;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      set_isa_override(isa);
      if (active_isa() != isa) continue;
      std::vector<float> out(q.size() + qdim), scratch(attention_scratch_floats(nh / nkv * T, hd));
      for (int g = 0; g < nkv; ++g) {
        attention_group_block(q.data(), qdim, T, ps.st->view(), 0, ps.seq(n), g, s, out.data(), qdim, scratch.data());
        attention_group(q.data(), ps.st->view(), 0, ps.seq(n - 9), g, s, &out[q.size()], scratch.data());
      }
      outs.push_back(out);
    }
    clear_isa_override();
    for (size_t i = 1; i < outs.size(); ++i)
      EXPECT_EQ(0, std::memcmp(outs[i].data(), outs[0].data(), outs[0].size() * 4)) << to_string(t) << " path " << i;
  }
}

// --- the tile kernels alone -------------------------------------------------

// Runs `k` over the tiles: kt/vt [tiles, 16, hd]; vis [tiles, T] (a tile
// whose tokens all see every key goes in unmasked).
std::vector<float> run_kernel(const attn::FlashKernel& k, const attn::FlashQuery& fq, const std::vector<float>& kt,
                              const std::vector<float>& vt, const std::vector<uint16_t>& vis, int tiles) {
  std::vector<float> state(attn::flash_state_floats(fq.rows(), fq.hd) + 16);
  float* st = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(state.data()) + 63) & ~uintptr_t(63));
  const size_t ldo = size_t(fq.r) * fq.hd + 5;
  std::vector<float> out(size_t(fq.T) * ldo, -3.f);
  k.begin(fq, st);
  for (int j = 0; j < tiles; ++j) {
    const uint16_t* m = &vis[size_t(j) * fq.T];
    const bool whole = std::all_of(m, m + fq.T, [](uint16_t b) { return b == 0xFFFF; });
    k.tile(fq, st, &kt[size_t(j) * 16 * fq.hd], &vt[size_t(j) * 16 * fq.hd], whole ? nullptr : m);
  }
  k.finish(fq, st, out.data(), ldo);
  return out;
}

// Soft-capped scores (Gemma 2) on the same tiles: the SIMD kernels give the
// scalar kernel's bits (`plain`: its uncapped output, which the cap changes).
void expect_capped_alike(const std::vector<const attn::FlashKernel*>& simd, const attn::FlashQuery& fq,
                         const std::vector<float>& kt, const std::vector<float>& vt, const std::vector<uint16_t>& vis,
                         int tiles, const std::vector<float>& plain) {
  attn::FlashQuery capped = fq;
  capped.softcap = 50.0f;
  const std::vector<float> ref = run_kernel(attn::flash_kernel_scalar(), capped, kt, vt, vis, tiles);
  EXPECT_NE(0, std::memcmp(ref.data(), plain.data(), plain.size() * 4)) << "the cap changed nothing";
  for (const attn::FlashKernel* k : simd)
    EXPECT_EQ(0, std::memcmp(run_kernel(*k, capped, kt, vt, vis, tiles).data(), ref.data(), ref.size() * 4))
        << (k == &attn::flash_kernel_avx2() ? "avx2" : "avx512") << " soft-capped";
}

// Random queries, tiles and masks (tokens that see nothing of a tile, or
// nothing of the first ones; unseen keys hold large values): every SIMD
// kernel gives the scalar kernel's bits, and the scalar kernel matches the
// softmax over the seen keys computed in double.
TEST(FlashKernels, SimdGiveScalarBitsAndScalarMatchesDouble) {
  const CpuFeatures& f = cpu_features();
  std::vector<const attn::FlashKernel*> simd;
  if (f.avx2 && f.fma) simd.push_back(&attn::flash_kernel_avx2());
  if (f.avx512f) simd.push_back(&attn::flash_kernel_avx512());
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Case { int T, r, hd, tiles; };
  // Up to half a vector of rows with hd a multiple of the lanes, the SIMD
  // kernels keep the outputs row-major (decode: T = 1): 1x4x64, 1x8x128,
  // 3x2x64, 2x4x32, 1x2x16, 1x3x80 there.
  for (Case c : {Case{1, 4, 64, 9}, Case{16, 4, 64, 5}, Case{7, 1, 8, 4}, Case{3, 8, 24, 6}, Case{16, 2, 128, 3},
                 Case{5, 3, 136, 4}, Case{13, 4, 16, 7}, Case{2, 1, 1, 3}, Case{1, 8, 128, 6}, Case{3, 2, 64, 5},
                 Case{2, 4, 32, 4}, Case{1, 2, 16, 3}, Case{1, 3, 80, 5},
                 // Several row groups of a vector each, the shape of a prefill query block
                 Case{12, 4, 40, 4}, Case{24, 4, 128, 5}, Case{28, 8, 64, 4}}) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " r " << c.r << " hd " << c.hd);
    const size_t ldq = size_t(c.r) * c.hd + 3, tile = size_t(16) * c.hd;
    std::vector<float> q(size_t(c.T) * ldq), kt(c.tiles * tile), vt(kt.size());
    for (auto& x : q) x = nd(rng);
    for (int j = 0; j < c.tiles; ++j)  // tiles of growing spread: the running max moves
      for (size_t e = 0; e < tile; ++e) kt[j * tile + e] = (1 + 0.5f * j) * nd(rng), vt[j * tile + e] = nd(rng);
    std::vector<uint16_t> vis(size_t(c.tiles) * c.T);
    for (int j = 0; j < c.tiles; ++j)
      for (int i = 0; i < c.T; ++i) {
        const unsigned u = rng();
        vis[size_t(j) * c.T + i] = uint16_t(j % 3 == 1 ? 0xFFFF : (u % 4 == 0 ? 0 : (u >> 8)));
      }
    for (int i = 0; i < c.T; ++i) vis[size_t(c.tiles - 1) * c.T + i] |= 1;  // every token sees a key
    for (int j = 0; j < c.tiles; ++j)  // keys no token sees: large, finite
      for (int t = 0; t < 16; ++t) {
        bool seen = false;
        for (int i = 0; i < c.T; ++i) seen |= (vis[size_t(j) * c.T + i] >> t & 1) != 0;
        if (!seen)
          for (int d = 0; d < c.hd; ++d) kt[j * tile + t * c.hd + d] = vt[j * tile + t * c.hd + d] = 1e6f;
      }
    // Learned sinks (gpt-oss): one logit per head, some above every score
    // (the sink sets the max), some far below, some in between.
    std::vector<float> sinks(size_t(c.r));
    for (int h = 0; h < c.r; ++h) sinks[size_t(h)] = h % 3 == 0 ? 6.f + nd(rng) : h % 3 == 1 ? -9.f : nd(rng);
    for (bool with_sinks : {false, true}) {
    SCOPED_TRACE(with_sinks ? "sinks" : "no sinks");
    const attn::FlashQuery fq{q.data(), ldq, c.T, c.r, c.hd, 1.0f / std::sqrt(float(c.hd)), 0.0f,
                              with_sinks ? sinks.data() : nullptr};
    const std::vector<float> ref = run_kernel(attn::flash_kernel_scalar(), fq, kt, vt, vis, c.tiles);
    const size_t ldo = size_t(c.r) * c.hd + 5;
    for (int i = 0; i < c.T; ++i)
      for (int h = 0; h < c.r; ++h) {
        std::vector<double> sc, p;
        std::vector<const float*> vrows;
        for (int j = 0; j < c.tiles; ++j)
          for (int t = 0; t < 16; ++t) {
            if (!(vis[size_t(j) * c.T + i] >> t & 1)) continue;
            double d = 0;
            for (int e = 0; e < c.hd; ++e) d += double(q[i * ldq + h * c.hd + e]) * kt[j * tile + t * c.hd + e];
            sc.push_back(d * fq.scale);
            vrows.push_back(&vt[j * tile + t * c.hd]);
          }
        double mx = *std::max_element(sc.begin(), sc.end());
        if (with_sinks) mx = std::max(mx, double(sinks[size_t(h)]));
        double sum = with_sinks ? std::exp(double(sinks[size_t(h)]) - mx) : 0.0;
        for (double x : sc) p.push_back(std::exp(x - mx)), sum += p.back();
        for (int e = 0; e < c.hd; ++e) {
          double o = 0;
          for (size_t u = 0; u < p.size(); ++u) o += p[u] / sum * vrows[u][e];
          ASSERT_NEAR(ref[i * ldo + h * c.hd + e], o, 1e-5 * (1 + std::fabs(o))) << "token " << i << " head " << h;
        }
      }
    for (const attn::FlashKernel* k : simd)
      EXPECT_EQ(0, std::memcmp(run_kernel(*k, fq, kt, vt, vis, c.tiles).data(), ref.data(), ref.size() * 4))
          << (k == &attn::flash_kernel_avx2() ? "avx2" : "avx512");
    expect_capped_alike(simd, fq, kt, vt, vis, c.tiles, ref);
    }
  }
}

// The polynomial exp2 of the softmax against std::exp2 over its range.
TEST(FlashKernels, Exp2MatchesLibm) {
  for (float x = -100.f; x <= 0.f; x += 0.001953125f) {
    const double want = std::exp2(double(x));
    ASSERT_LE(std::fabs(attn::exp2n_scalar(x) - want), 2.5e-7 * want) << x;
  }
  EXPECT_EQ(attn::exp2n_scalar(0.0f), 1.0f);  // a row left as it is: alpha = exp2n(m - m) = 1
  EXPECT_EQ(attn::exp2n_scalar(-INFINITY), attn::exp2n_scalar(attn::kExp2Lo));
}

TEST(Ops, RopeNormalAndNeoxRotatePairs) {
  // One head of 4 dims, n_rot 4, position 1, theta 10000: pair frequencies 1 and 0.01.
  RopeTable rt;
  float c[2], s[2];
  rt.compute(1, 4, 10000.f, c, s);
  EXPECT_NEAR(c[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(s[1], std::sin(0.01), 1e-7);
  float x[4] = {1, 2, 3, 4};
  rope_apply(x, 1, 4, 4, false, c, s);  // pairs (0,1), (2,3)
  EXPECT_NEAR(x[0], 1 * c[0] - 2 * s[0], 1e-6);
  EXPECT_NEAR(x[1], 1 * s[0] + 2 * c[0], 1e-6);
  EXPECT_NEAR(x[2], 3 * c[1] - 4 * s[1], 1e-6);
  float y[4] = {1, 2, 3, 4};
  rope_apply(y, 1, 4, 4, true, c, s);  // pairs (0,2), (1,3)
  EXPECT_NEAR(y[0], 1 * c[0] - 3 * s[0], 1e-6);
  EXPECT_NEAR(y[2], 1 * s[0] + 3 * c[0], 1e-6);
  EXPECT_NEAR(y[1], 2 * c[1] - 4 * s[1], 1e-6);
}

TEST(Ops, RmsnormSoftmaxSwiglu) {
  float x[3] = {1, -2, 3}, w[3] = {1, 0.5f, 2}, o[3];
  rmsnorm(x, w, o, 3, 0.f);
  const float inv = 1.0f / std::sqrt(14.0f / 3);
  EXPECT_NEAR(o[0], 1 * inv, 1e-6);
  EXPECT_NEAR(o[1], -1 * inv, 1e-6);
  EXPECT_NEAR(o[2], 6 * inv, 1e-6);
  float p[3] = {1000, 1001, 999};
  softmax_inplace(p, 3);
  EXPECT_NEAR(p[0] + p[1] + p[2], 1.0, 1e-6);
  EXPECT_NEAR(p[1] / p[0], std::exp(1.0), 1e-4);
  float g[2] = {2, -1}, u[2] = {3, 4};
  swiglu_inplace(g, u, 2);
  EXPECT_NEAR(g[0], 2 / (1 + std::exp(-2.0)) * 3, 1e-5);
  EXPECT_NEAR(g[1], -1 / (1 + std::exp(1.0)) * 4, 1e-5);
}

// Runs `op` on a copy of `in` under each ISA this machine has (scalar, AVX2,
// AVX-512) and expects `want`'s bits from every one.
template <class Op>
void expect_every_isa_gives(const std::vector<float>& want, const std::vector<float>& in, Op op) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    set_isa_override(isa);
    if (active_isa() != isa) {
      clear_isa_override();
      continue;
    }
    std::vector<float> got = in;
    op(got.data());
    clear_isa_override();
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << isa_name(isa) << " n=" << want.size();
  }
}

// SwiGLU on every ISA: bit-identical to the scalar definition (exp_poly.h)
// on random inputs, including the clamp range (|v| up to 120), odd tails,
// and within 1e-6 relative of silu computed in double.
TEST(Ops, SwigluSimdMatchesScalarDefinition) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> small(-8.f, 8.f), wide(-120.f, 120.f);
  for (int n : {1, 7, 16, 37, 5632}) {
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      g[size_t(i)] = i % 5 == 0 ? wide(rng) : small(rng);
      u[size_t(i)] = small(rng);
    }
    std::vector<float> want(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) want[size_t(i)] = poly::swiglu_scalar(g[size_t(i)], u[size_t(i)]);
    for (int i = 0; i < n; ++i) {
      const double v = g[size_t(i)], ref = v / (1.0 + std::exp(-v)) * u[size_t(i)];
      ASSERT_LE(std::fabs(want[size_t(i)] - ref), 1e-6 * std::fabs(ref) + 1e-30) << "v=" << v;
    }
    expect_every_isa_gives(want, g, [&](float* x) { swiglu_inplace(x, u.data(), n); });
  }
}

// gpt-oss's clamped SwiGLU: every ISA gives the scalar definition's bits,
// beyond the limit, at +-inf and NaN too; the definition is within float
// rounding of the double-precision formula.
TEST(Ops, ClampedSwigluSimdMatchesScalarDefinition) {
  const float alpha = 1.702f, limit = 7.0f;
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> small(-9.f, 9.f), wide(-120.f, 120.f);
  const float specials[] = {limit, -limit, std::nextafter(limit, 100.f), 0.0f, -0.0f, INFINITY, -INFINITY, NAN};
  for (int n : {1, 7, 16, 37, 2881}) {
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      g[size_t(i)] = i % 5 == 0 ? wide(rng) : small(rng);
      u[size_t(i)] = i % 7 == 0 ? wide(rng) : small(rng);
      if (i % 11 == 3) g[size_t(i)] = specials[size_t(i / 11) % 8];
      if (i % 13 == 4) u[size_t(i)] = specials[size_t(i / 13) % 8];
    }
    std::vector<float> want(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) want[size_t(i)] = poly::clamped_swiglu_scalar(g[size_t(i)], u[size_t(i)], alpha, limit);
    for (int i = 0; i < n; ++i) {
      if (!std::isfinite(g[size_t(i)]) || !std::isfinite(u[size_t(i)])) continue;
      const double x = std::min(double(g[size_t(i)]), double(limit));
      const double y = std::clamp(double(u[size_t(i)]), -double(limit), double(limit));
      const double ref = x / (1.0 + std::exp(-double(alpha) * x)) * (y + 1.0);
      // The float product alpha * -x rounds the exponent's argument: a
      // relative error up to |alpha x| ulps of one on top of the polynomial's.
      const double tol = 1e-6 + 1.2e-7 * std::fabs(double(alpha) * x);
      ASSERT_LE(std::fabs(want[size_t(i)] - ref), tol * std::fabs(ref) + 1e-30) << "g=" << g[size_t(i)];
    }
    expect_every_isa_gives(want, g, [&](float* x) { clamped_swiglu_inplace(x, u.data(), n, alpha, limit); });
  }
}

}  // namespace
