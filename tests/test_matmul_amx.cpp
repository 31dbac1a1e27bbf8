// AMX-INT8 tile kernels (kernels/matmul_amx.cpp): bit-identical to the
// AVX-512 VNNI path and to matmul_q8_reference for every AMX weight type,
// odd shapes, threads 1-3, n from 1 to 512, through matmul and matmul_multi;
// the dispatch (threshold per type, ISA override, KVS_ISA=avx512) decides
// where tiles run. Skipped where the CPU has no AMX or Linux refused it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/amx_rows.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/threadpool.h"
#include "kernels/weight_pack.h"
#include "isa_guard.h"
#include "quant_weights.h"

namespace kvs {
namespace {

const GgmlType kAmxTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                              GgmlType::MXFP4};
// The n values: two blocks per product (up to 8 rows) and one (9), single
// and partial M tiles (15, 16, 17, 31, 32, 33), activation rows in several
// L2 chunks (255 .. 512).
const int64_t kNs[] = {1, 2, 3, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 128, 255, 256, 511, 512};


// Every type on tiles from n = 1 for the test's duration.
struct AllNOnTiles {
  AllNOnTiles() {
    for (GgmlType t : kAmxTypes) set_amx_min_rows(t, 1);
  }
  ~AllNOnTiles() { reset_amx_min_rows(); }
};

// Why AMX is not in use here, or "" when it is.
std::string amx_missing() {
  const CpuFeatures& f = cpu_features();
  if (!f.amx_tile || !f.amx_int8) return "the CPU has no AMX-TILE / AMX-INT8";
  if (!f.amx_os) return "the OS does not enable tile state (XCR0)";
  if (!f.amx_permitted) return "Linux refused the tile data permission (arch_prctl)";
  IsaGuard g(Isa::Amx);
  if (active_isa() != Isa::Amx) return "Isa::Amx is not selectable here";
  return "";
}

using Weights = test::QuantWeights;
Weights make_packed(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  return test::panel16_weights(t, rows, cols, seed);
}

std::vector<float> make_x(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.01f, 10.0f);
  std::vector<float> x(size_t(n * cols));  // [n, cols]
  for (int64_t i = 0; i < n; ++i) {
    const float m = mag(rng);
    for (int64_t c = 0; c < cols; ++c) x[size_t(i * cols + c)] = nd(rng) * m;
  }
  return x;
}

// Shapes per type: rows never a multiple of 16 (a partial last panel),
// one K slice and several (32 blocks each; an odd block count for Q8_0 /
// Q4_0, whose last pair unit is half empty; MXFP4's quad units 3, 1 and 2
// blocks full).
std::vector<std::pair<int64_t, int64_t>> shapes_for(GgmlType t) {
  // K-quants: at 5888 columns, n >= 288 runs K in parts (their XTile budget).
  if (t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K) return {{45, 256}, {301, 2304}, {45, 5888}};
  if (t == GgmlType::MXFP4) return {{45, 96}, {301, 2080}, {45, 2112}};
  return {{45, 96}, {301, 2080}};
}

class AmxType : public ::testing::TestWithParam<GgmlType> {};

// A row's result does not depend on n (the determinism contract), so one
// n = 512 reference serves every n: each product must equal its first n rows.
TEST_P(AmxType, BitIdenticalToVnniAndReference) {
  if (const std::string why = amx_missing(); !why.empty()) GTEST_SKIP() << why;
  const GgmlType t = GetParam();
  AllNOnTiles on;
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
  uint32_t seed = 3;
  for (const auto& [rows, cols] : shapes_for(t)) {
    Weights W = make_packed(t, rows, cols, seed++);
    ASSERT_EQ(W.view.pack, PackLayout::Panel16);
    const int64_t nmax = 512, ldy = rows + 3;  // padding columns must stay untouched
    std::vector<float> x = make_x(nmax, cols, seed++);
    std::vector<float> ref(size_t(nmax * ldy), -1.0f), vnni(size_t(nmax * ldy), -1.0f);
    matmul_q8_reference(W.view, x.data(), cols, nmax, ref.data(), ldy);
    {
      IsaGuard g(Isa::Avx512);
      matmul(W.view, x.data(), cols, nmax, vnni.data(), ldy, pools[1]);
    }
    ASSERT_EQ(0, std::memcmp(vnni.data(), ref.data(), ref.size() * 4)) << "VNNI differs from the reference";
    IsaGuard g(Isa::Amx);
    for (int64_t n : kNs) {
      ASSERT_TRUE(amx_tiles_run(W.view, n));
      for (ThreadPool& pool : pools) {
        std::vector<float> y(size_t(n * ldy), -1.0f);
        matmul(W.view, x.data(), cols, n, y.data(), ldy, pool);
        ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4))
            << type_name(t) << " rows=" << rows << " cols=" << cols << " n=" << n << " threads=" << pool.size();
      }
    }
  }
}

// Long prompts run in chunks of M tiles (matmul_amx.cpp, chunk_count):
// an output whose rows are a multiple of 1 KiB apart (an unpadded gate /
// up projection's) in chunks of a few M tiles, and a long K in chunks
// whose activation tiles fit the L2 budget (K-quants' larger than the
// others'). The same bits as VNNI at every chunking.
TEST_P(AmxType, WideOutputsChunkedAlikeBits) {
  if (const std::string why = amx_missing(); !why.empty()) GTEST_SKIP() << why;
  const GgmlType t = GetParam();
  AllNOnTiles on;
  ThreadPool pool(2);
  const int64_t rows = 45;
  struct Case {
    int64_t cols, ldy;
  };
  const Case cases[] = {{shapes_for(t).front().second, 8192}, {4096, rows + 3}};
  for (const Case& c : cases) {
    Weights W = make_packed(t, rows, c.cols, 77);
    for (int64_t n : {144, 255, 512}) {
      std::vector<float> x = make_x(n, c.cols, uint32_t(n));
      std::vector<float> vnni(size_t(n * c.ldy), -1.0f), amx(size_t(n * c.ldy), -1.0f);
      {
        IsaGuard g(Isa::Avx512);
        matmul(W.view, x.data(), c.cols, n, vnni.data(), c.ldy, pool);
      }
      IsaGuard g(Isa::Amx);
      matmul(W.view, x.data(), c.cols, n, amx.data(), c.ldy, pool);
      ASSERT_EQ(0, std::memcmp(amx.data(), vnni.data(), amx.size() * 4))
          << type_name(t) << " cols=" << c.cols << " ldy=" << c.ldy << " n=" << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, AmxType, ::testing::ValuesIn(kAmxTypes),
                         [](const auto& info) { return type_name(info.param); });

// Q/K/V and gate/up as one dispatch: every AMX type beside a float matrix
// and a file-layout one (VNNI), each output equal to its own VNNI matmul.
TEST(Amx, MultiEqualsVnniProducts) {
  if (const std::string why = amx_missing(); !why.empty()) GTEST_SKIP() << why;
  AllNOnTiles on;
  const int64_t cols = 512;
  std::vector<Weights> ws;
  uint32_t seed = 40;
  for (GgmlType t : kAmxTypes) ws.push_back(make_packed(t, 16 * 3 + 7, cols, seed++));
  ws.push_back(make_packed(GgmlType::F16, 9, cols, seed++));
  Weights plain = make_packed(GgmlType::Q4_K, 21, cols, seed++);
  plain.view.packed = nullptr;  // the file layout: VNNI even under AMX
  plain.view.pack = PackLayout::None;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 5, 16, 33, 128}) {
      std::vector<float> x = make_x(n, cols, uint32_t(n));
      std::vector<std::vector<float>> want(ws.size() + 1), got(ws.size() + 1);
      std::vector<MatmulOut> outs;
      for (size_t j = 0; j <= ws.size(); ++j) {
        const WeightView& v = j < ws.size() ? ws[j].view : plain.view;
        want[j].assign(size_t(n * v.rows), 0.0f);
        got[j].assign(size_t(n * v.rows), -1.0f);
        {
          IsaGuard g(Isa::Avx512);
          matmul(v, x.data(), cols, n, want[j].data(), v.rows, pool);
        }
        outs.push_back({&v, got[j].data(), v.rows});
      }
      IsaGuard g(Isa::Amx);
      matmul_multi(outs.data(), int(outs.size()), x.data(), cols, n, pool);
      for (size_t j = 0; j < outs.size(); ++j)
        ASSERT_EQ(0, std::memcmp(got[j].data(), want[j].data(), got[j].size() * 4))
            << "output " << j << " threads=" << threads << " n=" << n;
    }
  }
}

// Where tiles run: only on Isa::Amx, only Panel16 copies of the AMX types,
// only from the type's threshold on.
TEST(Amx, DispatchFollowsIsaTypeAndThreshold) {
  Weights q8 = make_packed(GgmlType::Q8_0, 32, 64, 1);
  std::vector<uint8_t> q51_bytes(32 * row_bytes(GgmlType::Q5_1, 64));  // [32, row_bytes]
  const WeightView q51{GgmlType::Q5_1, q51_bytes.data(), 32, 64, row_bytes(GgmlType::Q5_1, 64)};
  EXPECT_FALSE(amx_tile_type(GgmlType::Q5_1));
  EXPECT_EQ(default_amx_min_rows(GgmlType::F16), kAmxNever);
  reset_amx_min_rows();
  for (GgmlType t : kAmxTypes) {
    EXPECT_EQ(amx_min_rows(t), default_amx_min_rows(t));
    EXPECT_GE(default_amx_min_rows(t), 2) << "n = 1 is memory bound: VNNI decode";
  }
  set_amx_min_rows(GgmlType::Q8_0, 7);
  EXPECT_FALSE(amx_tiles_apply(q8.view, 6));
  EXPECT_TRUE(amx_tiles_apply(q8.view, 7));
  EXPECT_FALSE(amx_tiles_apply(q51, 512));  // no AMX kernel, no Panel16 copy
  WeightView file = q8.view;
  file.pack = PackLayout::None;
  EXPECT_FALSE(amx_tiles_apply(file, 512));
  set_amx_min_rows(GgmlType::Q8_0, kAmxNever);
  EXPECT_FALSE(amx_tiles_apply(q8.view, 1 << 20));
  EXPECT_THROW(set_amx_min_rows(GgmlType::Q8_0, 0), std::invalid_argument);
  EXPECT_THROW(set_amx_min_rows(GgmlType::F16, 4), std::invalid_argument);
  set_amx_min_rows(GgmlType::Q8_0, 7);
  {
    IsaGuard g(Isa::Avx512);  // the override lowers AMX to VNNI
    EXPECT_NE(active_isa(), Isa::Amx);
    EXPECT_FALSE(amx_tiles_run(q8.view, 512));
  }
  if (amx_missing().empty()) {
    IsaGuard g(Isa::Amx);
    EXPECT_TRUE(amx_tiles_run(q8.view, 7));
    EXPECT_FALSE(amx_tiles_run(q8.view, 6));
  }
  reset_amx_min_rows();
  EXPECT_EQ(amx_min_rows(GgmlType::Q8_0), default_amx_min_rows(GgmlType::Q8_0));
}

// KVS_ISA names the levels; "avx512" lowers an AMX machine to the VNNI
// kernels. The environment is read once per process, so the check runs in a
// child: this test binary again, filtered to this test, with KVS_ISA set.
TEST(Amx, EnvAvx512LowersAmx) {
  if (const char* e = std::getenv("KVS_ISA"); e && std::string(e) == "avx512") {
    EXPECT_LE(int(active_isa()), int(Isa::Avx512));
    if (std::getenv("KVS_TEST_HAS_AMX")) {
      EXPECT_EQ(active_isa(), Isa::Avx512);
    }
    Weights q8 = make_packed(GgmlType::Q8_0, 32, 64, 1);
    EXPECT_FALSE(amx_tiles_run(q8.view, 512));
    return;
  }
  EXPECT_EQ(isa_name(Isa::Amx), "amx");
  if (const std::string why = amx_missing(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_EQ(active_isa(), Isa::Amx) << "AMX is the best level here";
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  const std::string cmd = "KVS_ISA=avx512 KVS_TEST_HAS_AMX=1 '" + std::string(self) +
                          "' --gtest_filter=Amx.EnvAvx512LowersAmx >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "under KVS_ISA=avx512 the child saw AMX";
}

}  // namespace
}  // namespace kvs
