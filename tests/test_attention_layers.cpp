// What attention does differently per layer: a layer's own sliding window
// (keys with p - k >= W hidden, on top of the sequence's window policy) and
// soft-capped scores (Gemma 2). Against a double-precision reference on the
// visible keys, on every ISA path and KV type; query blocks against one token
// at a time, bit for bit; the soft-capped tile kernels of every ISA against
// the scalar one, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "kernels/attention.h"
#include "kernels/cpu.h"
#include "kernels/flash_attention.h"
#include "kernels/kv_codec.h"
#include "kv/block_storage.h"
#include "kv/window_policy.h"

using namespace kvs;

namespace {

class LayerAttn : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { set_isa_override(GetParam()); }
  void TearDown() override { clear_isa_override(); }
};

// One sequence of n tokens in its own blocks (table reversed), K/V random;
// kd/vd: the rows as the cache gives them back (a quantized cache stores
// only complete groups; the rest are the sequence's own rows).
struct Seq {
  KvLayout lay;
  std::unique_ptr<BlockStorage> st;
  std::vector<int32_t> table;
  size_t row = 0;
  std::vector<float> k, v, kd, vd;
  int group() const { return lay.quantized() ? lay.group_tokens : 1; }
  int n_stored(int ctx) const { return lay.quantized() ? (ctx - 1) / group() * group() : ctx; }
  AttnSeq seq(int ctx, int window) const {
    const int ns = n_stored(ctx);
    AttnSeq as{table.data(), ctx, ns, k.data() + size_t(ns) * row, v.data() + size_t(ns) * row};
    as.window = window;
    return as;
  }
};

Seq make_seq(const KvLayout& lay, int n, unsigned seed) {
  Seq s;
  s.lay = lay;
  s.row = lay.row_floats();
  const int bs = lay.block_size, nb = (n + bs - 1) / bs;
  s.st = std::make_unique<BlockStorage>(lay, nb + 1);
  for (int i = 0; i < nb; ++i) s.table.push_back(int32_t(nb - i));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  s.k.resize(size_t(n) * s.row);
  s.v.resize(s.k.size());
  for (auto& x : s.k) x = 1.5f * nd(rng);
  for (auto& x : s.v) x = nd(rng);
  const KvStorage& kv = s.st->view();
  const int G = s.group(), stored = lay.quantized() ? n / G * G : n;
  for (int p = 0; p < stored; p += G) {
    const size_t o = size_t(p) * s.row;
    if (lay.quantized()) kvc::store_group(kv, s.table[size_t(p / bs)], 0, p % bs, &s.k[o], &s.v[o]);
    else kvc::store_rows(kv, s.table[size_t(p / bs)], 0, p % bs, 1, &s.k[o], &s.v[o]);
  }
  s.kd = s.k;
  s.vd = s.v;
  for (int p = 0; p < stored; ++p)
    for (int g = 0; g < lay.n_kv_heads; ++g) {
      const size_t o = size_t(p) * s.row + size_t(g) * lay.head_dim;
      kvc::load_k(kv, s.table[size_t(p / bs)], 0, g, p % bs, 1, &s.kd[o]);
      kvc::load_v(kv, s.table[size_t(p / bs)], 0, g, p % bs, 1, &s.vd[o]);
    }
  return s;
}

// The double reference over the keys a query with context ctx sees: the
// policy's view, then the layer window (p - k < W).
std::vector<float> reference(const Seq& s, const float* q, int ctx, const WindowView& vw, int window,
                             const AttnShape& sh) {
  std::vector<float> kr, vr;
  const int ns = s.n_stored(ctx), p = ctx - 1;
  for (int t = 0; t < ctx; ++t) {
    const bool policy = t < vw.sink_end || t >= vw.win_start || vw.sink_end >= vw.win_start;
    if (!policy || (window > 0 && p - t >= window)) continue;
    const size_t o = size_t(t) * s.row;
    kr.insert(kr.end(), (t < ns ? s.kd : s.k).begin() + long(o), (t < ns ? s.kd : s.k).begin() + long(o + s.row));
    vr.insert(vr.end(), (t < ns ? s.vd : s.v).begin() + long(o), (t < ns ? s.vd : s.v).begin() + long(o + s.row));
  }
  std::vector<float> out(size_t(sh.n_heads) * sh.head_dim);
  attention_reference(q, kr.data(), vr.data(), int(kr.size() / s.row), sh, out.data());
  return out;
}

// A layer window alone and under native / StreamingLLM policies (unrotated
// keys), f32 / f16 / int8 caches, soft-capped or not: one token at a time
// matches the reference on exactly the visible keys (within tol; bf16: the
// bf16 tiles).
void expect_windows_match_reference(bool bf16, double tol) {
  const int nh = 4, nkv = 2, hd = 32, bs = 8, n = 90;
  for (KvType type : {KvType::F32, KvType::F16, KvType::Int8}) {
    KvLayout lay{1, nkv, hd, bs};
    lay.type = type;
    lay.group_tokens = 4;
    const Seq s = make_seq(lay, n, 7);
    for (const WindowPolicy& w : {WindowPolicy{}, WindowPolicy::native(40), WindowPolicy::streaming(30, 4, true)})
      for (int window : {1, 5, 16, 33, 200})
        for (float cap : {0.f, 2.5f}) {
          AttnShape sh{nh, nkv, hd, 1.0f / std::sqrt(float(hd)), cap};
          sh.bf16 = bf16;
          for (int ctx : {1, 6, 17, 34, 64, 90}) {
            SCOPED_TRACE(::testing::Message() << to_string(type) << " " << w.describe() << " window " << window
                                              << " cap " << cap << " ctx " << ctx);
            const WindowView vw = w.view(ctx - 1);
            AttnSeq as = s.seq(ctx, window);
            as.sink_end = vw.sink_end;
            as.win_start = vw.win_start;
            std::vector<float> q(size_t(nh) * hd), out(q.size()), scratch(attention_scratch_floats(nh / nkv, hd, bf16));
            for (size_t i = 0; i < q.size(); ++i) q[i] = 2.f * std::cos(0.7f * float(i) + float(ctx));
            for (int g = 0; g < nkv; ++g) attention_group(q.data(), s.st->view(), 0, as, g, sh, out.data(), scratch.data());
            const std::vector<float> ref = reference(s, q.data(), ctx, vw, window, sh);
            for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], tol * (1 + std::fabs(ref[i]))) << i;
          }
        }
  }
}

TEST_P(LayerAttn, WindowAndSoftcapMatchReference) { expect_windows_match_reference(false, 3e-5); }

// Query blocks under a layer window: each token masks its own window, so a
// block gives every token the bits of its lone call, for windows that cut
// tiles anywhere and blocks longer than the window (bf16: the bf16 tiles).
void expect_windowed_blocks_match(bool bf16) {
  const int nh = 8, nkv = 2, hd = 64, n = 77;
  for (KvType type : {KvType::F32, KvType::F16, KvType::Int8}) {
    KvLayout lay{1, nkv, hd, 16};
    lay.type = type;
    lay.group_tokens = 16;
    const Seq s = make_seq(lay, n, 11);
    AttnShape sh{nh, nkv, hd, 0.125f, type == KvType::F16 ? 3.f : 0.f};
    sh.bf16 = bf16;
    const size_t qdim = size_t(nh) * hd;
    for (int window : {1, 7, 16, 21, 40})
      for (int T : {2, 9, 16}) {
        SCOPED_TRACE(::testing::Message() << to_string(type) << " window " << window << " T " << T);
        // The block ends at a group end for a quantized cache (its tokens share the own rows).
        const int last = type == KvType::Int8 ? 64 : n;
        std::vector<float> q(size_t(T) * qdim), blk(q.size(), -7.f), one(q.size(), -9.f);
        for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(1.1f * float(i));
        std::vector<float> scratch(attention_scratch_floats(nh / nkv * T, hd, bf16));
        for (int g = 0; g < nkv; ++g)
          attention_group_block(q.data(), qdim, T, s.st->view(), 0, s.seq(last, window), g, sh, blk.data(), qdim,
                                scratch.data());
        for (int i = 0; i < T; ++i) {
          const int ctx = last - (T - 1 - i);
          const AttnSeq as = s.seq(ctx, window);
          for (int g = 0; g < nkv; ++g)
            attention_group(&q[size_t(i) * qdim], s.st->view(), 0, as, g, sh, &one[size_t(i) * qdim], scratch.data());
        }
        ASSERT_EQ(0, std::memcmp(blk.data(), one.data(), blk.size() * 4));
      }
  }
}

TEST_P(LayerAttn, WindowedQueryBlockMatchesOneTokenAtATime) { expect_windowed_blocks_match(false); }

// The same two on the bf16 tiles (--prefill-precision bf16): within bf16
// rounding of the reference, and still no bit moved by the query block.
TEST(LayerAttnBf16, WindowsMatchReferenceAndBlocksChangeNoBit) {
  if (!amx_bf16_active()) GTEST_SKIP() << "no AMX-BF16 here (amx_bf16 and avx512_bf16 in lscpu's flags): the bf16 attention cannot run";
  expect_windows_match_reference(true, 2e-2);
  expect_windowed_blocks_match(true);
}

INSTANTIATE_TEST_SUITE_P(AllPaths, LayerAttn, ::testing::Values(Isa::Scalar, Isa::Avx2, Isa::Avx512),
                         [](const auto& i) { return isa_name(i.param); });

// The soft-capped tile kernels: SIMD give the scalar kernel's bits on random
// queries, tiles and masks; odd head sizes and row counts.
TEST(FlashKernels, SoftcappedSimdGiveScalarBits) {
  const CpuFeatures& f = cpu_features();
  std::vector<const attn::FlashKernel*> simd;
  if (f.avx2 && f.fma) simd.push_back(&attn::flash_kernel_avx2());
  if (f.avx512f) simd.push_back(&attn::flash_kernel_avx512());
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Case { int T, r, hd, tiles; float cap; };
  for (Case c : {Case{1, 4, 64, 5, 50.f}, Case{16, 2, 128, 3, 2.f}, Case{7, 3, 24, 4, 0.5f}, Case{5, 1, 136, 3, 30.f}}) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " r " << c.r << " hd " << c.hd << " cap " << c.cap);
    const size_t ldq = size_t(c.r) * c.hd, tile = size_t(16) * c.hd;
    std::vector<float> q(size_t(c.T) * ldq), kt(c.tiles * tile), vt(kt.size());
    for (auto& x : q) x = 3.f * nd(rng);
    for (auto& x : kt) x = nd(rng);
    for (auto& x : vt) x = nd(rng);
    std::vector<uint16_t> vis(size_t(c.tiles) * c.T);
    for (auto& m : vis) m = uint16_t(rng() | 1u);
    const attn::FlashQuery fq{q.data(), ldq, c.T, c.r, c.hd, 1.0f / std::sqrt(float(c.hd)), c.cap};
    auto run = [&](const attn::FlashKernel& k) {
      std::vector<float> state(attn::flash_state_floats(fq.rows(), fq.hd) + 16), out(size_t(c.T) * ldq);
      float* st = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(state.data()) + 63) & ~uintptr_t(63));
      k.begin(fq, st);
      for (int j = 0; j < c.tiles; ++j)
        k.tile(fq, st, &kt[j * tile], &vt[j * tile], j % 2 ? &vis[size_t(j) * c.T] : nullptr);
      k.finish(fq, st, out.data(), ldq);
      return out;
    };
    const std::vector<float> ref = run(attn::flash_kernel_scalar());
    for (const attn::FlashKernel* k : simd) EXPECT_EQ(0, std::memcmp(run(*k).data(), ref.data(), ref.size() * 4));
  }
}

// The bf16 kernel's lazy maximum (flash_attention.h's kLazyMaxLog2): scores
// that climb by about 6 (head 0) and 12 (head 1) log2 units a key, to some
// 1,500 and 2,900, then fall back and climb again, over several calls of key
// tiles. Keys and queries are exact in bf16 up to the query's scale, so the
// kernel stays within bf16 rounding of the double reference; a reference
// that never moved would give inf and NaN, one moved wrongly another
// softmax. A query block gives each of its tokens its one-token bits.
TEST(AttentionBf16Lazy, ClimbingScoresMatchReference) {
  if (!amx_bf16_active()) GTEST_SKIP() << "no AMX-BF16 here (amx_bf16 in lscpu's flags, not lowered by KVS_ISA)";
  const int hd = 64, nh = 2, n = 700, bs = 16, nb = (n + bs - 1) / bs, T = 16;
  KvLayout lay{1, 1, hd, bs};
  BlockStorage st(lay, nb);
  std::vector<int32_t> table(static_cast<size_t>(nb));
  for (int i = 0; i < nb; ++i) table[size_t(i)] = nb - 1 - i;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  std::vector<float> k(size_t(n) * hd), v(k.size());
  for (int t = 0; t < n; ++t) {
    for (int d = 0; d < hd; ++d) {
      k[size_t(t) * hd + d] = float(t % 256) * 0.5f;  // 0 .. 127.5, twice: exact in bf16
      v[size_t(t) * hd + d] = ud(rng);
    }
    kvc::store_rows(st.view(), table[size_t(t / bs)], 0, t % bs, 1, &k[size_t(t) * hd], &v[size_t(t) * hd]);
  }
  const size_t qdim = size_t(nh) * hd;
  std::vector<float> q(size_t(T) * qdim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = i % qdim < size_t(hd) ? 1.f : 2.f;
  AttnShape s{nh, 1, hd, 1.0f / std::sqrt(float(hd))};
  s.bf16 = true;
  std::vector<float> scratch(attention_scratch_floats(nh * T, hd, true)), one(q.size()), blk(q.size());
  for (int ctx : {5, 100, 256, 300, 600, n}) {
    SCOPED_TRACE(::testing::Message() << "ctx " << ctx);
    const AttnSeq as{table.data(), ctx, ctx, nullptr, nullptr};
    attention_group(q.data(), st.view(), 0, as, 0, s, one.data(), scratch.data());
    std::vector<float> ref(qdim);
    attention_reference(q.data(), k.data(), v.data(), ctx, s, ref.data());
    for (size_t e = 0; e < qdim; ++e) ASSERT_NEAR(one[e], ref[e], 2e-2 * (1 + std::fabs(ref[e]))) << "element " << e;
  }
  const AttnSeq last{table.data(), n, n, nullptr, nullptr};
  attention_group_block(q.data(), qdim, T, st.view(), 0, last, 0, s, blk.data(), qdim, scratch.data());
  for (int i = 0; i < T; ++i) {
    const int ctx = n - (T - 1 - i);
    const AttnSeq as{table.data(), ctx, ctx, nullptr, nullptr};
    attention_group(&q[size_t(i) * qdim], st.view(), 0, as, 0, s, &one[size_t(i) * qdim], scratch.data());
  }
  EXPECT_EQ(0, std::memcmp(blk.data(), one.data(), blk.size() * 4));
}

}  // namespace
