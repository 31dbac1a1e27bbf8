// AMX-BF16 tile kernels for float weights (kernels/matmul_amx_bf16.cpp,
// MatmulPrecision::Bf16): exact where bfloat16 inputs make every sum exact,
// within float32 rounding of a bfloat16 reference elsewhere, the same bits
// whatever n, threads or entry point (the determinism contract), and a clear
// refusal where AMX-BF16 is not usable. Skipped (with the reason) where the
// CPU has no AMX-BF16 or Linux refused the tiles.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/threadpool.h"
#include "kernels/weight_pack.h"
#include "model/model.h"
#include "test_util.h"
#include "isa_guard.h"

namespace kvs {
namespace {


// Why the bf16 tiles cannot run here, or "" when they can.
std::string bf16_missing() {
  const CpuFeatures& f = cpu_features();
  if (!f.amx_bf16 || !f.avx512bf16) return "the CPU has no AMX-BF16 / AVX512-BF16";
  if (!amx_bf16_active()) return "Isa::Amx is not in use here (OS, permission or KVS_ISA)";
  return "";
}

// A float weight matrix in the file layout plus its AmxBf16 copy.
struct Weights {
  std::vector<uint8_t> bytes;  // [rows, row_bytes]
  WeightView view;
  PackedArena arena;
};

// values(r, c) as type t (F32 exactly; F16 / BF16 rounded to nearest even).
template <class F>
Weights make_weights(GgmlType t, int64_t rows, int64_t cols, F values) {
  Weights w;
  const size_t es = t == GgmlType::F32 ? 4 : 2;
  w.bytes.assign(size_t(rows * cols) * es, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = values(r, c);
      uint8_t* d = w.bytes.data() + size_t(r * cols + c) * es;
      if (t == GgmlType::F32) std::memcpy(d, &v, 4);
      else {
        const uint16_t h = t == GgmlType::F16 ? f32_to_fp16(v) : f32_to_bf16(v);
        std::memcpy(d, &h, 2);
      }
    }
  w.view = WeightView{t, w.bytes.data(), rows, cols, size_t(cols) * es};
  w.arena = PackedArena(packed_size(w.view, PackLayout::AmxBf16));
  pack_panels_into(w.view, PackLayout::AmxBf16, w.arena.data());
  w.view.packed = w.arena.data();
  w.view.pack = PackLayout::AmxBf16;
  return w;
}

// count values of N(0, 1).
std::vector<float> normal_values(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& e : v) e = nd(rng);
  return v;
}

// Weight element (r, c) as the tiles see it: the file's value rounded to bf16.
float weight_bf16(const Weights& w, int64_t r, int64_t c) {
  std::vector<float> row(size_t(w.view.cols));
  dequantize_weight_row(w.view, r, row.data());
  return bf16_to_f32(f32_to_bf16(row[size_t(c)]));
}

const GgmlType kTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16};
// Weight rows never only whole panels, columns not always whole chunks.
const std::pair<int64_t, int64_t> kShapes[] = {{1, 32}, {17, 40}, {45, 96}, {33, 2048}, {50, 300}};
const int64_t kNs[] = {1, 2, 15, 16, 17, 31, 32, 33, 64, 100};

// Small integers are exact in bfloat16 and so are all their sums: any layout,
// padding or store mistake shows as a wrong integer.
TEST(MatmulBf16, ExactOnSmallIntegers) {
  if (const std::string why = bf16_missing(); !why.empty()) GTEST_SKIP() << why;
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
  for (GgmlType t : kTypes)
    for (const auto& [rows, cols] : kShapes) {
      Weights W = make_weights(t, rows, cols, [](int64_t r, int64_t c) { return float((r * 7 + c * 3) % 9 - 4); });
      const int64_t nmax = 100, ldy = rows + 3;  // padding columns must stay untouched
      std::vector<float> x(size_t(nmax * cols));   // [n, cols]
      for (int64_t i = 0; i < nmax; ++i)
        for (int64_t c = 0; c < cols; ++c) x[size_t(i * cols + c)] = float((i * 5 + c * 11) % 7 - 3);
      for (int64_t n : kNs)
        for (ThreadPool& pool : pools) {
          std::vector<float> y(size_t(n * ldy), -1000.0f);
          matmul(W.view, x.data(), cols, n, y.data(), ldy, pool);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t r = 0; r < ldy; ++r) {
              double want = -1000.0;
              if (r < rows) {
                want = 0.0;
                for (int64_t c = 0; c < cols; ++c) want += double((r * 7 + c * 3) % 9 - 4) * x[size_t(i * cols + c)];
              }
              ASSERT_EQ(double(y[size_t(i * ldy + r)]), want)
                  << type_name(t) << " rows=" << rows << " cols=" << cols << " n=" << n << " i=" << i << " r=" << r
                  << " threads=" << pool.size();
            }
        }
    }
}

// Weights are rounded to bfloat16 to nearest even, as f32_to_bf16 does: a
// one-hot activation reads each weight back through the tiles.
TEST(MatmulBf16, WeightsRoundToNearestEven) {
  if (const std::string why = bf16_missing(); !why.empty()) GTEST_SKIP() << why;
  ThreadPool pool(2);
  for (GgmlType t : kTypes) {
    std::vector<float> v = normal_values(20 * 64, 5);
    v[0] = 1.0f + 1.0f / 256;      // ties (to even: down, then up)
    v[1] = 1.0f + 3.0f / 256;
    v[2] = -65504.0f;               // the f16 extreme
    Weights W = make_weights(t, 20, 64, [&](int64_t r, int64_t c) { return v[size_t(r * 64 + c)]; });
    for (int64_t c : {0, 1, 2, 31, 32, 63}) {
      std::vector<float> x(64, 0.0f), y(20);
      x[size_t(c)] = 1.0f;
      matmul(W.view, x.data(), 64, 1, y.data(), 20, pool);
      for (int64_t r = 0; r < 20; ++r)
        ASSERT_EQ(y[size_t(r)], weight_bf16(W, r, c)) << type_name(t) << " r=" << r << " c=" << c;
    }
  }
}

// Random values: within float32 accumulation error of the exact sum of the
// bfloat16-rounded products, and visibly not the float32 result.
TEST(MatmulBf16, NearTheBf16Reference) {
  if (const std::string why = bf16_missing(); !why.empty()) GTEST_SKIP() << why;
  ThreadPool pool(2);
  const int64_t rows = 45, cols = 2048, n = 33;
  const std::vector<float> wv = normal_values(rows * cols, 7), x = normal_values(n * cols, 8);
  Weights W = make_weights(GgmlType::F32, rows, cols, [&](int64_t r, int64_t c) { return wv[size_t(r * cols + c)]; });
  std::vector<float> y(size_t(n * rows));
  matmul(W.view, x.data(), cols, n, y.data(), rows, pool);
  double worst = 0.0, moved = 0.0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0.0, mag = 0.0, f32 = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        const double a = bf16_to_f32(f32_to_bf16(x[size_t(i * cols + c)]));
        const double b = bf16_to_f32(f32_to_bf16(wv[size_t(r * cols + c)]));
        exact += a * b, mag += std::fabs(a * b);
        f32 += double(x[size_t(i * cols + c)]) * wv[size_t(r * cols + c)];
      }
      worst = std::max(worst, std::fabs(y[size_t(i * rows + r)] - exact) / mag);
      moved = std::max(moved, std::fabs(exact - f32) / mag);
    }
  EXPECT_LT(worst, 1e-6) << "further from the bf16 products' sum than float32 accumulation explains";
  EXPECT_GT(moved, 1e-4) << "the inputs were not rounded to bfloat16";
}

// A row's result depends only on that row: every n, thread count and entry
// point (matmul, matmul_multi, matmul_grouped) gives the same bits.
TEST(MatmulBf16, SameBitsWhateverTheBatch) {
  if (const std::string why = bf16_missing(); !why.empty()) GTEST_SKIP() << why;
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
  const int64_t rows = 77, cols = 200, nmax = 70;
  const std::vector<float> wv = normal_values(rows * cols, 11), x = normal_values(nmax * cols, 12);
  Weights W = make_weights(GgmlType::F16, rows, cols, [&](int64_t r, int64_t c) { return wv[size_t(r * cols + c)]; });
  std::vector<float> full(size_t(nmax * rows));
  matmul(W.view, x.data(), cols, nmax, full.data(), rows, pools[1]);
  for (int64_t n : {1, 5, 16, 33}) {
    for (int64_t i0 : {int64_t(0), int64_t(7), nmax - n}) {
      for (ThreadPool& pool : pools) {
        std::vector<float> y(size_t(n * rows)), ym(size_t(n * rows)), yg(size_t(n * rows));
        matmul(W.view, x.data() + i0 * cols, cols, n, y.data(), rows, pool);
        const MatmulOut out{&W.view, ym.data(), rows};
        matmul_multi(&out, 1, x.data() + i0 * cols, cols, n, pool);
        const MatmulGroup g{&W.view, x.data() + i0 * cols, cols, n, yg.data(), rows};
        matmul_grouped(&g, 1, pool);
        const size_t bytes = y.size() * 4;
        ASSERT_EQ(0, std::memcmp(y.data(), full.data() + i0 * rows, bytes)) << "n=" << n << " i0=" << i0;
        ASSERT_EQ(0, std::memcmp(ym.data(), y.data(), bytes)) << "matmul_multi n=" << n;
        ASSERT_EQ(0, std::memcmp(yg.data(), y.data(), bytes)) << "matmul_grouped n=" << n;
      }
    }
  }
}

// A long K (an FFN's down projection) is walked in spans of K with every
// panel pair's C tiles waiting in scratch from one span to the next, over
// several passes of activation rows and, on one thread, several groups of
// panel pairs: every integer still exact, and every row the same bits as
// when it runs alone (no spans then: a short pass holds all of K).
TEST(MatmulBf16, LongKInSpansKeepsEveryBit) {
  if (const std::string why = bf16_missing(); !why.empty()) GTEST_SKIP() << why;
  ThreadPool pools[2] = {ThreadPool(1), ThreadPool(2)};
  const int64_t rows = 560, cols = 2080, n = 300;  // 65 chunks, passes 256 + 44
  Weights I = make_weights(GgmlType::F16, rows, cols, [](int64_t r, int64_t c) { return float((r * 7 + c * 3) % 9 - 4); });
  std::vector<float> xi(size_t(n * cols));  // [n, cols]
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < cols; ++c) xi[size_t(i * cols + c)] = float((i * 5 + c * 11) % 7 - 3);
  std::vector<double> want(size_t(n * rows), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        want[size_t(i * rows + r)] += double((r * 7 + c * 3) % 9 - 4) * xi[size_t(i * cols + c)];
  const std::vector<float> wv = normal_values(rows * cols, 31), x = normal_values(n * cols, 32);
  Weights W = make_weights(GgmlType::F16, rows, cols, [&](int64_t r, int64_t c) { return wv[size_t(r * cols + c)]; });
  std::vector<float> alone(size_t(n * rows));
  for (int64_t i0 = 0; i0 < n; i0 += 20)
    matmul(W.view, x.data() + i0 * cols, cols, std::min<int64_t>(20, n - i0), alone.data() + i0 * rows, rows, pools[0]);
  for (ThreadPool& pool : pools) {
    std::vector<float> y(size_t(n * rows));
    matmul(I.view, xi.data(), cols, n, y.data(), rows, pool);
    for (size_t e = 0; e < y.size(); ++e)
      ASSERT_EQ(double(y[e]), want[e]) << "i=" << e / rows << " r=" << e % rows << " threads=" << pool.size();
    matmul(W.view, x.data(), cols, n, y.data(), rows, pool);
    ASSERT_EQ(0, std::memcmp(y.data(), alone.data(), y.size() * 4)) << "threads=" << pool.size();
  }
}

// Several groups, each its own weights (all three float types), input and
// row count, in one matmul_grouped call: each as its own matmul.
TEST(MatmulBf16, GroupsAreEachTheirOwnProduct) {
  if (const std::string why = bf16_missing(); !why.empty()) GTEST_SKIP() << why;
  ThreadPool pool(3);
  const int64_t cols = 96, ns[3] = {3, 40, 17}, rows[3] = {48, 33, 70};
  std::vector<Weights> W;
  std::vector<std::vector<float>> x(3), want(3), got(3);
  std::vector<MatmulGroup> groups;
  for (int g = 0; g < 3; ++g) {
    const std::vector<float> wv = normal_values(rows[g] * cols, 13 + g);
    W.push_back(make_weights(kTypes[g], rows[g], cols, [&](int64_t r, int64_t c) { return wv[size_t(r * cols + c)]; }));
    x[size_t(g)] = normal_values(ns[g] * cols, 23 + g);
    want[size_t(g)].resize(size_t(ns[g] * rows[g]));
    got[size_t(g)].resize(size_t(ns[g] * rows[g]));
    matmul(W.back().view, x[size_t(g)].data(), cols, ns[g], want[size_t(g)].data(), rows[g], pool);
  }
  for (int g = 0; g < 3; ++g)
    groups.push_back({&W[size_t(g)].view, x[size_t(g)].data(), cols, ns[g], got[size_t(g)].data(), rows[g]});
  matmul_grouped(groups.data(), 3, pool);
  for (int g = 0; g < 3; ++g)
    EXPECT_EQ(0, std::memcmp(got[size_t(g)].data(), want[size_t(g)].data(), want[size_t(g)].size() * 4)) << "group " << g;
}

// A bf16 load is refused where the tiles are not usable (this machine, or
// under a lowered ISA), and weights packed for bf16 refuse to run on a
// lowered ISA (no silent fp32). Runs on every machine.
TEST(MatmulBf16, RefusedWithoutTheTiles) {
  const bool tiles = bf16_missing().empty();
  IsaGuard g(tiles ? Isa::Avx512 : active_isa());
  EXPECT_FALSE(amx_bf16_active());
  if (test::shared_available()) {
    try {
      Model::load(test::shared("models/stories260K/stories260K.gguf"), "", nullptr, MatmulPrecision::Bf16);
      FAIL() << "a bf16 load went ahead without AMX-BF16";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("amx_bf16"), std::string::npos) << e.what();
    }
  }
  if (!tiles) return;  // packing the copy needs the machine's AVX512-BF16
  Weights W = make_weights(GgmlType::F32, 16, 32, [](int64_t, int64_t) { return 1.0f; });
  ThreadPool pool(1);
  std::vector<float> x(32, 1.0f), y(16);
  try {
    matmul(W.view, x.data(), 32, 1, y.data(), 16, pool);
    FAIL() << "a bf16 copy ran without AMX-BF16";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32"), std::string::npos) << e.what();
  }
}

// A bf16 load packs the float matrices as AmxBf16, says so, and has its
// own identity (its KV must not meet an fp32 load's in a shared cache).
TEST(MatmulBf16, ModelLoadTakesThePrecision) {
  if (const std::string why = bf16_missing(); !why.empty()) GTEST_SKIP() << why;
  if (!test::shared_available()) GTEST_SKIP() << "../shared is not here";
  const std::string path = test::shared("models/stories260K/stories260K.gguf");
  auto fp32 = Model::load(path);
  auto bf16 = Model::load(path, "", nullptr, MatmulPrecision::Bf16);
  EXPECT_EQ(fp32->precision(), MatmulPrecision::Fp32);
  EXPECT_EQ(bf16->precision(), MatmulPrecision::Bf16);
  EXPECT_NE(fp32->identity(), bf16->identity());
  EXPECT_EQ(bf16->weights().layers[0].wq.pack, PackLayout::AmxBf16);
  EXPECT_NE(fp32->weights().layers[0].wq.pack, PackLayout::AmxBf16);
  EXPECT_EQ(parse_precision("bf16"), MatmulPrecision::Bf16);
  EXPECT_THROW(parse_precision("fp16"), std::invalid_argument);
}

}  // namespace
}  // namespace kvs
