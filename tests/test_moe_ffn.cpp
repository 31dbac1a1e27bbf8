// The mixture-of-experts FFN (engine/moe_ffn.h): the batched fast path
// (tokens grouped by expert, grouped products) against the token-by-token
// scalar reference, bit for bit, on every ISA path, packed or not; a token's
// output alone equals its output inside a batch; routing and the clamped
// SwiGLU against their definitions; the whole layer against float64 math.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/moe_ffn.h"
#include "kernels/amx_rows.h"
#include "kernels/cpu.h"
#include "kernels/threadpool.h"
#include "kernels/weight_pack.h"
#include "isa_guard.h"

using namespace kvs;

namespace {



std::vector<float> randn(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng) * scale;
  return v;
}

// Random weights of one MoE layer: the experts quantized as one 3-D tensor
// [n_expert, rows, cols] and sliced per expert, as the loader does.
struct Layer {
  MoeConfig c;
  MoeWeights w;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<float>> floats;

  WeightView matrix(GgmlType t, int64_t rows, int64_t cols, float scale, uint32_t seed) {
    const std::vector<float> src = randn(size_t(rows * cols), scale, seed);
    auto& b = bytes.emplace_back(size_t(rows) * row_bytes(t, cols));
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, &src[size_t(r * cols)], b.data() + r * row_bytes(t, cols), cols);
    return WeightView{t, b.data(), rows, cols, row_bytes(t, cols)};
  }
  std::vector<WeightView> experts(GgmlType t, int64_t rows, int64_t cols, float scale, uint32_t seed) {
    const WeightView all = matrix(t, int64_t(c.n_expert) * rows, cols, scale, seed);
    std::vector<WeightView> v;
    for (int e = 0; e < c.n_expert; ++e) {
      WeightView s = all;
      s.rows = rows;
      s.data = all.row(int64_t(e) * rows);
      v.push_back(s);
    }
    return v;
  }
  const float* vec(size_t n, float scale, uint32_t seed) { return floats.emplace_back(randn(n, scale, seed)).data(); }
};

enum class Kind { Mixtral, Qwen2Moe, Qwen3Moe, GptOss };

bool is_k(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q6_K; }
// K-quant rows are whole 256-element super-blocks.
int width_for(GgmlType t, int w) { return is_k(t) ? (w + 255) / 256 * 256 : w; }

Layer make_layer(Kind kind, GgmlType t, int dim, uint32_t seed) {
  Layer L;
  MoeConfig& c = L.c;
  c.n_expert = kind == Kind::Qwen3Moe ? 16 : kind == Kind::Qwen2Moe ? 6 : 8;
  c.n_used = kind == Kind::Qwen3Moe ? 4 : 2;
  c.ffn_dim = width_for(t, 96);
  c.norm_weights = kind == Kind::Mixtral || kind == Kind::Qwen3Moe;
  if (kind == Kind::GptOss) {
    c.gating = MoeGating::TopKSoftmax;
    c.act = MoeActivation::SwiGLUClamped;
  }
  const float s_in = 1.f / std::sqrt(float(dim));
  L.w.router = L.matrix(GgmlType::F32, c.n_expert, dim, 4 * s_in, seed);  // llama.cpp keeps routers F32
  L.w.gate = L.experts(t, c.ffn_dim, dim, 2 * s_in, seed + 1);
  L.w.up = L.experts(t, c.ffn_dim, dim, 2 * s_in, seed + 2);
  L.w.down = L.experts(t, dim, c.ffn_dim, 1.f / std::sqrt(float(c.ffn_dim)), seed + 3);
  if (kind == Kind::GptOss) {
    L.w.router_bias = L.vec(size_t(c.n_expert), 0.5f, seed + 4);
    L.w.gate_bias = L.vec(size_t(c.n_expert) * c.ffn_dim, 0.5f, seed + 5);
    L.w.up_bias = L.vec(size_t(c.n_expert) * c.ffn_dim, 0.5f, seed + 6);
    L.w.down_bias = L.vec(size_t(c.n_expert) * dim, 0.5f, seed + 7);
  }
  if (kind == Kind::Qwen2Moe) {
    c.shared_ffn_dim = width_for(t, 160);
    L.w.sh_gate = L.matrix(t, c.shared_ffn_dim, dim, 2 * s_in, seed + 8);
    L.w.sh_up = L.matrix(t, c.shared_ffn_dim, dim, 2 * s_in, seed + 9);
    L.w.sh_down = L.matrix(t, dim, c.shared_ffn_dim, 1.f / std::sqrt(float(c.shared_ffn_dim)), seed + 10);
    L.w.sh_gate_inp = L.vec(size_t(dim), s_in, seed + 11);
  }
  return L;
}

std::vector<PackItem> pack_items(Layer& L) {
  std::vector<PackItem> items{{&L.w.router, false}};
  for (auto* v : {&L.w.gate, &L.w.up, &L.w.down})
    for (WeightView& x : *v) items.push_back({&x, false});
  if (L.w.sh_gate.data)
    for (WeightView* x : {&L.w.sh_gate, &L.w.sh_up, &L.w.sh_down}) items.push_back({x, false});
  return items;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Mixtral: return "mixtral";
    case Kind::Qwen2Moe: return "qwen2moe";
    case Kind::Qwen3Moe: return "qwen3moe";
    default: return "gpt-oss";
  }
}

TEST(MoeFfn, FastPathEqualsScalarReferenceBitwise) {
  for (Kind kind : {Kind::Mixtral, Kind::Qwen2Moe, Kind::Qwen3Moe, Kind::GptOss}) {
    // MXFP4: gpt-oss's experts (17-byte blocks: slices and packed copies at odd offsets).
    for (GgmlType t :
         {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q6_K, GgmlType::MXFP4}) {
      const int dim = width_for(t, 96);
      for (bool packed : {false, true}) {
        Layer L = make_layer(kind, t, dim, 17);
        PackedArena arena;
        if (packed) arena = pack_weights(pack_items(L));
        for (int64_t T : {1, 5, 37}) {
          const std::vector<float> x = randn(size_t(T) * dim, 1.f, uint32_t(T));
          // The reference's float products follow the view's order (k-chain once packed).
          std::vector<float> ref(size_t(T) * dim);
          moe_ffn_reference(L.c, L.w, x.data(), T, dim, ref.data());
          for (Isa isa : kAllIsas) {
            if (!isa_available(isa)) continue;
            IsaGuard g(isa);
            // Tiles from the first row on, so the experts' small groups run on them too.
            if (isa == Isa::Amx)
              for (GgmlType a : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::MXFP4})
                set_amx_min_rows(a, 1);
            for (int threads : {1, 3}) {
              ThreadPool pool(threads);
              MoeFfn moe;
              std::vector<float> got(size_t(T) * dim, -1.f);
              moe.forward(L.c, L.w, x.data(), T, dim, got.data(), pool);
              ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4))
                  << kind_name(kind) << " " << type_name(t) << " T=" << T << " " << isa_name(isa)
                  << " threads=" << threads << " packed=" << packed;
            }
            reset_amx_min_rows();
          }
        }
      }
    }
  }
}

TEST(MoeFfn, TokenAloneEqualsTokenInBatch) {
  const int dim = 64;
  for (Kind kind : {Kind::Mixtral, Kind::Qwen2Moe, Kind::GptOss}) {
    Layer L = make_layer(kind, GgmlType::Q8_0, dim, 5);
    PackedArena arena = pack_weights(pack_items(L));
    ThreadPool pool(2);
    MoeFfn moe;
    const int64_t T = 48;  // enough rows for the AMX tile path on the batch
    const std::vector<float> x = randn(size_t(T) * dim, 1.f, 3);
    std::vector<float> batch(size_t(T) * dim), one(static_cast<size_t>(dim));
    moe.forward(L.c, L.w, x.data(), T, dim, batch.data(), pool);
    for (int64_t t = 0; t < T; ++t) {
      moe.forward(L.c, L.w, &x[size_t(t) * dim], 1, dim, one.data(), pool);
      ASSERT_EQ(0, std::memcmp(one.data(), &batch[size_t(t) * dim], dim * 4)) << kind_name(kind) << " token " << t;
    }
    // Every expert got some rows: the batch really was grouped.
    std::vector<int> seen(size_t(L.c.n_expert));
    std::vector<int32_t> ids(size_t(L.c.n_used));
    std::vector<float> lg(size_t(L.c.n_expert)), wts(size_t(L.c.n_used)), scratch(size_t(L.c.n_expert));
    for (int64_t t = 0; t < T; ++t) {
      matmul_q8_reference(L.w.router, &x[size_t(t) * dim], dim, 1, lg.data(), L.c.n_expert);
      if (L.w.router_bias)
        for (int e = 0; e < L.c.n_expert; ++e) lg[size_t(e)] += L.w.router_bias[e];
      moe_route(L.c, lg.data(), ids.data(), wts.data(), scratch.data());
      for (int32_t e : ids) ++seen[size_t(e)];
    }
    for (int e = 0; e < L.c.n_expert; ++e) EXPECT_GT(seen[size_t(e)], 0) << kind_name(kind) << " expert " << e;
  }
}

TEST(MoeFfn, RoutingFollowsTheDefinitions) {
  MoeConfig c;
  c.n_expert = 5;
  c.n_used = 2;
  const float lg[5] = {1.0f, 3.0f, -2.0f, 3.0f, 2.5f};  // experts 1 and 3 tie
  int32_t ids[2];
  float w[2], scratch[5];
  // Softmax over all five, then the top two (the tie goes to the lower id first).
  moe_route(c, lg, ids, w, scratch);
  double z = 0;
  for (float v : lg) z += std::exp(double(v));
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0], std::exp(3.0) / z, 1e-7);
  EXPECT_NEAR(w[1], std::exp(3.0) / z, 1e-7);
  // Renormalised over the chosen two.
  c.norm_weights = true;
  moe_route(c, lg, ids, w, scratch);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 0.5f);
  // Top three of the logits, softmax over those three only.
  c.n_used = 3;
  c.norm_weights = false;
  c.gating = MoeGating::TopKSoftmax;
  int32_t ids3[3];
  float w3[3];
  moe_route(c, lg, ids3, w3, scratch);
  EXPECT_EQ(ids3[0], 1);
  EXPECT_EQ(ids3[1], 3);
  EXPECT_EQ(ids3[2], 4);
  const double z3 = 2 * std::exp(3.0) + std::exp(2.5);
  EXPECT_NEAR(w3[0], std::exp(3.0) / z3, 1e-7);
  EXPECT_NEAR(w3[2], std::exp(2.5) / z3, 1e-7);
  EXPECT_NEAR(double(w3[0]) + w3[1] + w3[2], 1.0, 1e-6);
  // NaN scores (a broken hidden state) still give k distinct, valid experts.
  const float nan = std::nanf("");
  const float bad[5] = {nan, 2.0f, nan, nan, nan};
  moe_route(c, bad, ids3, w3, scratch);
  EXPECT_EQ(ids3[0], 1);
  for (int j = 0; j < 3; ++j) EXPECT_TRUE(ids3[j] >= 0 && ids3[j] < 5);
  EXPECT_TRUE(ids3[0] != ids3[1] && ids3[1] != ids3[2] && ids3[0] != ids3[2]);
}

TEST(MoeFfn, ClampedSwigluMatchesGptOssDefinition) {
  MoeConfig c;
  c.act = MoeActivation::SwiGLUClamped;
  const std::vector<float> gate = {-9.f, -1.f, 0.f, 0.5f, 3.f, 6.99f, 7.f, 12.f, -0.25f};
  const std::vector<float> up = {0.f, 2.f, -8.f, 9.f, -0.5f, 7.5f, -7.f, 1.f, -3.f};
  std::vector<float> g = gate;
  moe_activation(c, g.data(), up.data(), int(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    // x = min(gate, 7); y = clamp(up, -7, 7); x * sigmoid(1.702 x) * (y + 1): the linear half gets + 1.
    const double x = std::min(double(gate[i]), 7.0), y = std::max(std::min(double(up[i]), 7.0), -7.0);
    const double want = x / (1.0 + std::exp(-1.702 * x)) * (y + 1.0);
    EXPECT_NEAR(g[i], want, 1e-6 * (1.0 + std::fabs(want))) << "gate " << gate[i] << " up " << up[i];
  }
}

// The whole layer against float64 math on the exactly dequantized weights
// (EngineOptions::exact): catches a reference that is wrong the same way.
TEST(MoeFfn, ExactPathMatchesFloat64Math) {
  for (Kind kind : {Kind::Mixtral, Kind::Qwen2Moe, Kind::GptOss}) {
    const int D = 256;  // Q4_K rows are whole super-blocks
    Layer L = make_layer(kind, GgmlType::Q4_K, D, 9);
    const MoeConfig& c = L.c;
    const int64_t T = 3;
    const std::vector<float> x = randn(size_t(T) * D, 1.f, 21);
    ThreadPool pool(2);
    MoeFfn moe;
    std::vector<float> got(size_t(T) * D);
    moe.forward(c, L.w, x.data(), T, D, got.data(), pool, /*exact=*/true);
    auto dot = [](const WeightView& w, int64_t r, const double* v) {
      std::vector<float> row(size_t(w.cols));
      dequantize_row(w.type, w.row(r), row.data(), w.cols);
      double a = 0;
      for (int64_t i = 0; i < w.cols; ++i) a += double(row[size_t(i)]) * v[i];
      return a;
    };
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> xv(x.begin() + t * D, x.begin() + (t + 1) * D), lg(size_t(c.n_expert));
      for (int e = 0; e < c.n_expert; ++e) lg[size_t(e)] = dot(L.w.router, e, xv.data()) + (L.w.router_bias ? L.w.router_bias[e] : 0.0);
      std::vector<int> order(size_t(c.n_expert));
      for (int e = 0; e < c.n_expert; ++e) order[size_t(e)] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lg[size_t(a)] > lg[size_t(b)]; });
      std::vector<double> wk(size_t(c.n_used));
      double zall = 0, zk = 0;
      for (double v : lg) zall += std::exp(v);
      for (int j = 0; j < c.n_used; ++j) zk += std::exp(lg[size_t(order[size_t(j)])]);
      for (int j = 0; j < c.n_used; ++j) {
        const double p = std::exp(lg[size_t(order[size_t(j)])]);
        wk[size_t(j)] = c.gating == MoeGating::TopKSoftmax || c.norm_weights ? p / zk : p / zall;
      }
      std::vector<double> want(size_t(D), 0.0);
      auto ffn = [&](const WeightView& wg, const WeightView& wu, const WeightView& wd, const float* bg, const float* bu,
                     const float* bd, bool clamped, double scale) {
        const int64_t F = wg.rows;
        std::vector<double> h(static_cast<size_t>(F));
        for (int64_t i = 0; i < F; ++i) {
          double g = dot(wg, i, xv.data()) + (bg ? bg[i] : 0.0), u = dot(wu, i, xv.data()) + (bu ? bu[i] : 0.0);
          if (clamped) {
            g = std::min(g, 7.0);
            u = std::max(std::min(u, 7.0), -7.0);
            h[size_t(i)] = g / (1 + std::exp(-1.702 * g)) * (u + 1);
          } else {
            h[size_t(i)] = g / (1 + std::exp(-g)) * u;
          }
        }
        for (int i = 0; i < D; ++i) want[size_t(i)] += scale * (dot(wd, i, h.data()) + (bd ? bd[i] : 0.0));
      };
      for (int j = 0; j < c.n_used; ++j) {
        const int e = order[size_t(j)];
        const int64_t F = c.ffn_dim;
        ffn(L.w.gate[size_t(e)], L.w.up[size_t(e)], L.w.down[size_t(e)], L.w.gate_bias ? L.w.gate_bias + e * F : nullptr,
            L.w.up_bias ? L.w.up_bias + e * F : nullptr, L.w.down_bias ? L.w.down_bias + int64_t(e) * D : nullptr,
            c.act == MoeActivation::SwiGLUClamped, wk[size_t(j)]);
      }
      if (L.w.sh_gate.data) {
        double s = 0;
        for (int i = 0; i < D; ++i) s += xv[size_t(i)] * L.w.sh_gate_inp[i];
        ffn(L.w.sh_gate, L.w.sh_up, L.w.sh_down, nullptr, nullptr, nullptr, false, 1 / (1 + std::exp(-s)));
      }
      for (int i = 0; i < D; ++i)
        ASSERT_NEAR(got[size_t(t * D + i)], want[size_t(i)], 2e-5 * (1 + std::fabs(want[size_t(i)])))
            << kind_name(kind) << " token " << t << " element " << i;
    }
  }
}

}  // namespace
