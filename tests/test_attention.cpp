// Paged attention (through a block table, scattered blocks) against a
// double-precision contiguous reference, for MHA, GQA and MQA shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/attention.h"
#include "kernels/attention_simd.h"
#include "kernels/cpu.h"
#include "kernels/exp_poly.h"
#include "kernels/kv_codec.h"
#include "kernels/ops.h"
#include "kv/block_storage.h"

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
    AttnShape s{sh.nh, sh.nkv, sh.hd, 1.0f / std::sqrt(float(sh.hd))};
    std::vector<float> out(sh.nh * sh.hd, -7.f), ref(sh.nh * sh.hd);
    std::vector<float> scratch(attention_scratch_floats(sh.nh / sh.nkv, sh.n_ctx, sh.bs, sh.hd));
    const AttnSeq as{table.data(), sh.n_ctx, sh.n_ctx, nullptr, nullptr};
    for (int g = 0; g < sh.nkv; ++g) attention_group(q.data(), st.view(), layer, as, g, s, out.data(), scratch.data());
    attention_reference(q.data(), k.data(), v.data(), sh.n_ctx, s, ref.data());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 2e-5 * (1 + std::fabs(ref[i]))) << i;
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
    const AttnShape s{sh.nh, sh.nkv, sh.hd, 1.0f / std::sqrt(float(sh.hd))};
    const int r = sh.nh / sh.nkv;
    std::vector<float> blk(sh.T * qdim, -7.f), one(sh.T * qdim, -9.f);
    std::vector<float> scratch(attention_scratch_floats(r * sh.T, sh.n_ctx, sh.bs, sh.hd));
    const AttnSeq last{table.data(), sh.n_ctx, sh.n_ctx, nullptr, nullptr};
    for (int g = 0; g < sh.nkv; ++g)
      attention_group_block(q.data(), qdim, sh.T, st.view(), 0, last, g, s, blk.data(), qdim, scratch.data());
    for (int i = 0; i < sh.T; ++i) {
      const int ctx = sh.n_ctx - (sh.T - 1 - i);
      const AttnSeq as{table.data(), ctx, ctx, nullptr, nullptr};
      for (int g = 0; g < sh.nkv; ++g)
        attention_group(&q[i * qdim], st.view(), 0, as, g, s, &one[i * qdim], scratch.data());
    }
    ASSERT_EQ(0, std::memcmp(blk.data(), one.data(), blk.size() * 4));
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, AttentionIsa, ::testing::Values(Isa::Scalar, Isa::Avx2, Isa::Avx512),
                         [](const auto& i) { return isa_name(i.param); });

// The SIMD inner loops against the scalar ones at every width 1..80 (masked
// and unmasked tails), random inputs.
TEST(Attention, VecOpsMatchScalar) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> ud(-2.f, 2.f);
  const attn::VecOps& sc = attn::vec_ops_scalar();
  const CpuFeatures& f = cpu_features();
  std::vector<const attn::VecOps*> paths;
  if (f.avx2 && f.fma) paths.push_back(&attn::vec_ops_avx2());
  if (f.avx512f) paths.push_back(&attn::vec_ops_avx512());
  for (int n = 1; n <= 80; ++n) {
    std::vector<float> a(n), b(n), y0(n), y1(n);
    for (int i = 0; i < n; ++i) a[i] = ud(rng), b[i] = ud(rng), y0[i] = y1[i] = ud(rng);
    const float ref = sc.dot(a.data(), b.data(), n);
    sc.axpy(0.37f, a.data(), y0.data(), n);
    for (const attn::VecOps* p : paths) {
      EXPECT_NEAR(p->dot(a.data(), b.data(), n), ref, 1e-5f * n) << n;
      std::vector<float> y = y1;
      p->axpy(0.37f, a.data(), y.data(), n);
      for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], y0[i], 1e-6f) << n << " " << i;
    }
  }
}

// The tile kernels (scores, accum, softmax) of every SIMD path against the
// scalar ones on random inputs, at head_dim 8 (masked), 24, 64, 128 and 136
// (wider than the register-resident path); and a row's result is
// bit-identical whether it is computed alone or among R rows.
TEST(Attention, TileKernelsMatchScalarAndAreRowIndependent) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.f, 1.f);
  const attn::VecOps& sc = attn::vec_ops_scalar();
  const CpuFeatures& f = cpu_features();
  std::vector<const attn::VecOps*> paths{&sc};
  if (f.avx2 && f.fma) paths.push_back(&attn::vec_ops_avx2());
  if (f.avx512f) paths.push_back(&attn::vec_ops_avx512());
  for (int hd : {8, 24, 64, 128, 136}) {
    const int R = 8, n = 19;
    const size_t ldk = size_t(hd) * 3, lds = 23;
    std::vector<float> q(size_t(R) * hd), k(size_t(n) * ldk), p(size_t(R) * lds), o0(size_t(R) * hd);
    for (auto& x : q) x = nd(rng);
    for (auto& x : k) x = nd(rng);
    for (auto& x : p) x = std::fabs(nd(rng));
    for (auto& x : o0) x = nd(rng);
    std::vector<float> s_ref(size_t(R) * lds, 0.f), out_ref = o0;
    sc.scores(q.data(), R, k.data(), ldk, n, hd, 0.125f, s_ref.data(), lds);
    sc.accum(p.data(), lds, R, k.data(), ldk, n, hd, out_ref.data());
    for (const attn::VecOps* ops : paths) {
      std::vector<float> s(size_t(R) * lds, 0.f), out = o0;
      ops->scores(q.data(), R, k.data(), ldk, n, hd, 0.125f, s.data(), lds);
      ops->accum(p.data(), lds, R, k.data(), ldk, n, hd, out.data());
      for (int j = 0; j < R; ++j)
        for (int i = 0; i < n; ++i)
          EXPECT_NEAR(s[size_t(j) * lds + i], s_ref[size_t(j) * lds + i], 1e-5f * (1 + std::fabs(s_ref[size_t(j) * lds + i])))
              << hd;
      for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], out_ref[i], 1e-4f * (1 + std::fabs(out_ref[i]))) << hd;
      // Row 5 alone (R = 1) gives the same bits as inside the R = 8 tile.
      std::vector<float> s1(lds, 0.f), out1(o0.begin() + 5 * hd, o0.begin() + 6 * hd);
      ops->scores(q.data() + 5 * hd, 1, k.data(), ldk, n, hd, 0.125f, s1.data(), lds);
      ops->accum(p.data() + 5 * lds, lds, 1, k.data(), ldk, n, hd, out1.data());
      EXPECT_EQ(0, std::memcmp(s1.data(), s.data() + 5 * lds, size_t(n) * 4)) << hd;
      EXPECT_EQ(0, std::memcmp(out1.data(), out.data() + 5 * hd, size_t(hd) * 4)) << hd;
      // Softmax: against the scalar one, any length.
      for (int len : {1, 7, 16, 33, 300}) {
        std::vector<float> a(static_cast<size_t>(len)), b;
        for (auto& x : a) x = 8 * nd(rng);
        b = a;
        sc.softmax(a.data(), len);
        ops->softmax(b.data(), len);
        for (int i = 0; i < len; ++i) EXPECT_NEAR(b[size_t(i)], a[size_t(i)], 1e-6f + 2e-6f * a[size_t(i)]) << len;
      }
    }
  }
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
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      set_isa_override(isa);
      if (active_isa() != isa) {
        clear_isa_override();
        continue;
      }
      std::vector<float> got = g;
      swiglu_inplace(got.data(), u.data(), n);
      clear_isa_override();
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), size_t(n) * 4)) << isa_name(isa) << " n=" << n;
    }
  }
}

}  // namespace
