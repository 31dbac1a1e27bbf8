// matmul_glu (kernels/matmul.h): an FFN's down projection with its gate's
// activation quantized as it is made must give the bits of the activation
// in place followed by matmul(), for every weight type, packed or not, on
// every ISA path this CPU has (the AMX tiles from n = 1), n across single
// and several M tiles, threads 1-3, widths that end in a partial piece;
// quantized weights leave G as it was.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/amx_rows.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kernels/threadpool.h"
#include "kernels/weight_pack.h"
#include "isa_guard.h"
#include "quant_weights.h"

namespace kvs {
namespace {

using Weights = test::QuantWeights;

// Gate and up rows [n, ld]: the gate spans the activation's curve (large
// negative values saturate it), rows of different magnitudes.
std::vector<float> make_rows(int64_t n, int64_t ld, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.05f, spread);
  std::vector<float> x(size_t(n * ld));
  for (int64_t i = 0; i < n; ++i) {
    const float m = mag(rng);
    for (int64_t c = 0; c < ld; ++c) x[size_t(i * ld + c)] = nd(rng) * m;
  }
  return x;
}

struct AllNOnTiles {
  AllNOnTiles() {
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                       GgmlType::MXFP4})
      set_amx_min_rows(t, 1);
  }
  ~AllNOnTiles() { reset_amx_min_rows(); }
};

bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// One weight view against every ISA, n, thread count and activation.
void expect_fused_equals_unfused(const WeightView& w, const std::string& what) {
  const int64_t cols = w.cols, ld = cols + 16, rows = w.rows, nmax = 130;
  const std::vector<float> g0 = make_rows(nmax, ld, uint32_t(cols), 8.0f), u = make_rows(nmax, ld, uint32_t(rows), 3.0f);
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx}) {
    IsaGuard guard(isa);
    if (active_isa() != isa) continue;
    for (Glu act : {Glu::SwiGlu, Glu::GeGlu}) {
      for (int64_t n : {1, 5, 16, 40, 130}) {
        for (ThreadPool& pool : pools) {
          std::vector<float> a = g0, b = g0, want(size_t(n * rows), -1.0f), got(want.size(), -2.0f);
          for (int64_t i = 0; i < n; ++i) {
            if (act == Glu::GeGlu) geglu_inplace(&a[size_t(i * ld)], &u[size_t(i * ld)], int(cols));
            else swiglu_inplace(&a[size_t(i * ld)], &u[size_t(i * ld)], int(cols));
          }
          matmul(w, a.data(), ld, n, want.data(), rows, pool);
          matmul_glu(w, b.data(), u.data(), ld, act, n, got.data(), rows, pool);
          ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4))
              << what << " isa=" << isa_name(isa) << " act=" << int(act) << " n=" << n << " threads=" << pool.size();
          if (!is_float(w.type) && w.pack != PackLayout::AmxBf16) {
            ASSERT_EQ(0, std::memcmp(b.data(), g0.data(), g0.size() * 4)) << what << ": G changed";
          }
        }
      }
    }
  }
}

TEST(MatmulGlu, BitIdenticalToActivationThenMatmul) {
  AllNOnTiles on;
  const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::Q8_0, GgmlType::Q4_0,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::MXFP4};
  uint32_t seed = 7;
  for (GgmlType t : types) {
    const bool k = t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
    // Widths ending in a partial piece of the fused quantizing: 768 = 512 + 256, 2080 = 4 * 512 + 32.
    for (int64_t cols : {k ? int64_t(768) : int64_t(2080), int64_t(256)}) {
      Weights w = test::quant_weights(t, 37, cols, seed++);
      const std::string what = type_name(t) + " cols=" + std::to_string(cols);
      expect_fused_equals_unfused(w.view, what + " file layout");
      if (!packable(w.view)) continue;
      w.arena = pack_weights({{&w.view, false}});
      expect_fused_equals_unfused(w.view, what + " packed");
    }
  }
}

TEST(MatmulGlu, RejectsAMissingUp) {
  ThreadPool pool(1);
  Weights w = test::quant_weights(GgmlType::Q8_0, 4, 64, 1);
  std::vector<float> g(64), y(4);
  EXPECT_THROW(matmul_glu(w.view, g.data(), nullptr, 64, Glu::SwiGlu, 1, y.data(), 4, pool), std::invalid_argument);
}

}  // namespace
}  // namespace kvs
