// matmul: every weight type x every ISA path x odd shapes, against
//  - matmul_q8_reference (the scalar quantized-activation algorithm): bit-exact,
//  - matmul_reference (exact dequantized weights, double dot): within a bound
//    derived from the int8 activation rounding error,
// plus the determinism contract (a row's result never depends on n or on the
// other rows of X) and thread-count independence.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/decode_variant.h"
#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "kernels/quant_internal.h"
#include "kernels/threadpool.h"
#include "kernels/weight_pack.h"
#include "isa_guard.h"

namespace kvs {
namespace {

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                              GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::MXFP4};

bool is_k(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K; }
bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// A weight matrix quantized from random floats; blocks get different
// magnitudes so per-block scales matter.
struct Weights {
  std::vector<uint8_t> bytes;  // [rows, row_stride]
  WeightView view;
};

Weights make_weights(GgmlType t, int64_t rows, int64_t cols, uint32_t seed, size_t pad = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.2f, 3.0f);
  Weights w;
  const size_t rb = row_bytes(t, cols);
  const size_t stride = rb + pad;
  w.bytes.assign(size_t(rows) * stride + 64, 0xCD);
  std::vector<float> src(static_cast<size_t>(cols));  // [cols]
  for (int64_t r = 0; r < rows; ++r) {
    float m = mag(rng);
    for (int64_t c = 0; c < cols; ++c) {
      if (c % 32 == 0) m = mag(rng);
      float v = nd(rng) * m;
      if (v == 0.0f) v = 0.5f;
      src[size_t(c)] = v;
    }
    quantize_row(t, src.data(), w.bytes.data() + r * stride, cols);
  }
  w.view.type = t;
  w.view.data = w.bytes.data();
  w.view.rows = rows;
  w.view.cols = cols;
  w.view.row_stride = stride;
  return w;
}

std::vector<float> make_x(int64_t n, int64_t ld, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.01f, 10.0f);
  std::vector<float> x(size_t(n * ld));  // [n, ld]
  for (int64_t i = 0; i < n; ++i) {
    const float m = mag(rng);
    for (int64_t c = 0; c < ld; ++c) x[size_t(i * ld + c)] = nd(rng) * m;
  }
  return x;
}

// Bound on |quantized-activation result - exact| for element (i, r): each x
// element moves by at most xd/2 = amax/254, amax over its block (the
// K-quants': its 256-element super-block); plus float rounding.
double error_bound(const WeightView& w, const float* xi, int64_t r) {
  std::vector<float> row(size_t(w.cols));  // [cols]
  dequantize_row(w.type, w.row(r), row.data(), w.cols);
  double bound = 0.0, l1 = 0.0;
  const int64_t group = is_k(w.type) ? 256 : 32;
  for (int64_t b = 0; b < w.cols; b += group) {
    const int64_t e = std::min<int64_t>(w.cols, b + group);
    double amax = 0.0, wl1 = 0.0;
    for (int64_t c = b; c < e; ++c) {
      amax = std::max(amax, double(std::fabs(xi[c])));
      wl1 += std::fabs(row[size_t(c)]);
      l1 += std::fabs(double(row[size_t(c)]) * xi[c]);
    }
    if (!is_float(w.type)) bound += amax / 254.0 * wl1 * 1.001;
  }
  return bound + l1 * (double(w.cols) + 8) * 1.2e-7 + 1e-30;
}

std::vector<int64_t> cols_for(GgmlType t) {
  if (is_k(t)) return {256, 768};
  if (is_float(t)) return {7, 32, 96, 100, 256, 768};
  if (t == GgmlType::MXFP4) return {32, 64, 96, 256, 800};  // every block count mod 4 (its packed units)
  return {32, 96, 256, 768};
}

void check_case(GgmlType t, Isa isa, int64_t rows, int64_t cols, int64_t n, ThreadPool& pool,
                uint32_t seed) {
  SCOPED_TRACE(type_name(t) + " " + isa_name(isa) + " rows=" + std::to_string(rows) +
               " cols=" + std::to_string(cols) + " n=" + std::to_string(n) +
               " threads=" + std::to_string(pool.size()));
  Weights W = make_weights(t, rows, cols, seed, seed % 3 == 0 ? 6 : 0);
  const int64_t ldx = cols + (seed % 2 ? 3 : 0), ldy = rows + (seed % 5 == 0 ? 2 : 0);
  std::vector<float> x = make_x(n, ldx, seed * 7 + 1);
  std::vector<float> y(size_t(n * ldy), -1.0f), yq(size_t(n * ldy), -1.0f), ye(size_t(n * ldy));
  {
    IsaGuard g(isa);
    matmul(W.view, x.data(), ldx, n, y.data(), ldy, pool);
  }
  matmul_q8_reference(W.view, x.data(), ldx, n, yq.data(), ldy);
  matmul_reference(W.view, x.data(), ldx, n, ye.data(), ldy);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    for (int64_t r = 0; r < rows && bad < 5; ++r) {
      const float a = y[size_t(i * ldy + r)], q = yq[size_t(i * ldy + r)];
      if (std::memcmp(&a, &q, 4) != 0) {
        ADD_FAILURE() << "not bit-exact with matmul_q8_reference at i=" << i << " r=" << r << ": "
                      << a << " vs " << q;
        ++bad;
      }
      const double e = ye[size_t(i * ldy + r)];
      const double bound = error_bound(W.view, x.data() + i * ldx, r);
      if (!(std::fabs(a - e) <= bound)) {
        ADD_FAILURE() << "too far from matmul_reference at i=" << i << " r=" << r << ": " << a
                      << " vs " << e << " (bound " << bound << ")";
        ++bad;
      }
    }
  }
  // Padding columns of y (between rows and ldy) must be untouched.
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[size_t(i * ldy + r)], -1.0f);
  // Determinism: each row alone (n = 1) with a different "batch" around it.
  if (n > 1) {
    IsaGuard g(isa);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> y1(size_t(rows), 0.0f);
      matmul(W.view, x.data() + i * ldx, ldx, 1, y1.data(), rows, pool);
      ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + i * ldy, size_t(rows) * 4)) << "row " << i;
    }
  }
  if (isa == Isa::Scalar) return;
  // The load-time copy: Panel16 on AVX-512, Panel8 on AVX2. Quantized: the
  // same bits as the file layout. Float: the k-chain order,
  // bit-exact with its scalar definition, within the error bound, and
  // independent of n.
  IsaGuard g(isa);
  if (!packable(W.view)) return;
  PackedArena arena = pack_weights({{&W.view, false}});
  ASSERT_EQ(W.view.pack, pack_layout_for(isa));
  std::vector<float> yp(size_t(n * ldy), -1.0f);
  matmul(W.view, x.data(), ldx, n, yp.data(), ldy, pool);
  if (!is_float(t)) {
    ASSERT_EQ(0, std::memcmp(yp.data(), y.data(), yp.size() * 4)) << "packed differs from file layout";
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(yp[size_t(i * ldy + r)], -1.0f) << "packed wrote padding";
  std::vector<float> yc(size_t(n * ldy), -1.0f);
  matmul_q8_reference(W.view, x.data(), ldx, n, yc.data(), ldy);  // k-chain for a packed float view
  ASSERT_EQ(0, std::memcmp(yp.data(), yc.data(), yp.size() * 4)) << "packed float not bit-exact with the k-chain reference";
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      const double e = ye[size_t(i * ldy + r)], bound = error_bound(W.view, x.data() + i * ldx, r);
      ASSERT_LE(std::fabs(yp[size_t(i * ldy + r)] - e), bound) << "packed float i=" << i << " r=" << r;
    }
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> y1(size_t(rows), 0.0f);
    matmul(W.view, x.data() + i * ldx, ldx, 1, y1.data(), rows, pool);
    ASSERT_EQ(0, std::memcmp(y1.data(), yp.data() + i * ldy, size_t(rows) * 4)) << "packed row " << i;
  }
}

class MatmulTypeTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulTypeTest, AllIsasShapesBatches) {
  const GgmlType t = GetParam();
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
  uint32_t seed = 1;
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa)) {
      std::printf("  [%s not available on this CPU: skipped]\n", isa_name(isa).c_str());
      continue;
    }
    for (int64_t rows : {1, 3, 17, 67})
      for (int64_t cols : cols_for(t))
        for (int64_t n : {1, 2, 5, 9, 13, 30, 64}) {  // 9 .. 30: in-place float passes (AVX2: 6 rows, AVX-512: 12)
          if (n >= 30 && cols > 256 && rows > 17) continue;  // keep the scalar reference quick
          check_case(t, isa, rows, cols, n, pools[seed % 3], seed);
          ++seed;
          if (HasFatalFailure()) return;
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulTypeTest, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return type_name(info.param); });

// Bigger shapes than the panel / task sizes: several tasks per thread, panel
// tails, k-range splitting in the GEMM path, n = 64 batched vs n = 1.
TEST(Matmul, LargeShapesDeterministicAcrossBatchAndThreads) {
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K,
                     GgmlType::F16, GgmlType::F32, GgmlType::Q5_1, GgmlType::MXFP4}) {
    const int64_t rows = 301, cols = 4096 + 512, n = 7;
    Weights W = make_weights(t, rows, cols, 99);
    std::vector<float> x = make_x(64, cols, 5);
    std::vector<float> ref(size_t(64 * rows));
    matmul_q8_reference(W.view, x.data(), cols, 64, ref.data(), rows);
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      IsaGuard g(isa);
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int64_t nn : {int64_t(1), n, int64_t(64)}) {
          std::vector<float> y(size_t(nn * rows));
          matmul(W.view, x.data(), cols, nn, y.data(), rows, pool);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4))
              << type_name(t) << " " << isa_name(isa) << " threads=" << threads << " n=" << nn;
        }
      }
    }
  }
}

// Panel16 copies (load-time repack, AVX-512): tail panels (301 rows = 18
// full panels + 13), odd and even block counts (the odd one leaves half a
// pair unit empty), Q4_K, Q5_K and Q6_K super-blocks, float k slices with a short
// last one (4192 = 16 x 256 + 96), every thread count and batch size:
// bit-exact with the scalar reference, so packing never changes a token
// (float views: their k-chain reference).
TEST(Matmul, PackedPanel16BitExact) {
  if (!isa_available(Isa::Avx512)) GTEST_SKIP() << "AVX-512 not available: Panel16 is not used here";
  IsaGuard g(Isa::Avx512);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                     GgmlType::F16, GgmlType::BF16, GgmlType::F32, GgmlType::MXFP4}) {
    // MXFP4's quad units: 1, 2 and 3 of the last unit's 4 blocks used.
    const std::vector<int64_t> widths = is_k(t) ? std::vector<int64_t>{4608, 256}
                                        : t == GgmlType::MXFP4 ? std::vector<int64_t>{4096 + 64, 4096 + 96, 32}
                                                               : std::vector<int64_t>{4608, 4096 + 96, 32};
    for (int64_t cols : widths) {
      const int64_t rows = 301;
      Weights W = make_weights(t, rows, cols, 7 + uint32_t(cols));
      std::vector<float> x = make_x(64, cols, 11);
      std::vector<float> ref(size_t(64 * rows));
      matmul_q8_reference(W.view, x.data(), cols, 64, ref.data(), rows);
      ASSERT_TRUE(packable(W.view));
      PackedArena arena = pack_weights({{&W.view, false}});
      ASSERT_EQ(W.view.pack, PackLayout::Panel16);
      // Float views change order with the copy (k-chain): the reference follows.
      if (is_float(t)) matmul_q8_reference(W.view, x.data(), cols, 64, ref.data(), rows);
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int64_t nn : {int64_t(1), int64_t(2), int64_t(7), int64_t(16), int64_t(64)}) {
          std::vector<float> y(size_t(nn * rows));
          matmul(W.view, x.data(), cols, nn, y.data(), rows, pool);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4))
              << type_name(t) << " cols=" << cols << " threads=" << threads << " n=" << nn;
        }
      }
    }
  }
}

// The documented Panel16 byte layout (weight_pack.h), at named offsets.
TEST(Matmul, PackedPanel16Layout) {
  const int64_t rows = 17, cols = 96;  // 2 panels, 3 blocks = 2 pair units (the last half empty)
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    Weights W = make_weights(t, rows, cols, 5);
    std::vector<uint8_t> p(packed_size(W.view, PackLayout::Panel16) + 64);
    uint8_t* dst = p.data() + (64 - reinterpret_cast<uintptr_t>(p.data()) % 64) % 64;
    pack_panel16(W.view, dst);
    const bool q8 = t == GgmlType::Q8_0;
    const int64_t lb = q8 ? 512 : 256, ub = 2 * lb + 64, pbytes = 2 * ub;
    ASSERT_EQ(packed_size(W.view, PackLayout::Panel16), size_t(2 * pbytes));
    auto blk = [&](int64_t r, int64_t b) { return W.view.row(r) + b * (q8 ? 34 : 18); };
    // Panel 0, block 1 (second half of unit 0), row 5, vector 3.
    for (int j = 0; j < 4; ++j) {
      const uint8_t want = q8 ? uint8_t(blk(5, 1)[2 + 12 + j] ^ 0x80) : blk(5, 1)[2 + 12 + j];
      EXPECT_EQ(dst[lb + 64 * 3 + 4 * 5 + j], want) << type_name(t) << " byte " << j;
    }
    // Its fp16 scale: after both level blocks, second group of 16.
    EXPECT_EQ(0, std::memcmp(dst + 2 * lb + 32 + 2 * 5, blk(5, 1), 2));
    // Panel 1 holds row 16 in lane 0 and repeats it in lanes 1..15.
    for (int lane : {0, 1, 15}) EXPECT_EQ(0, std::memcmp(dst + pbytes + 2 * lb + 2 * lane, blk(16, 0), 2));
    // Block 2 lives in unit 1; the unit's second half is zero.
    EXPECT_EQ(dst[ub + 4 * 2], q8 ? uint8_t(blk(2, 2)[2] ^ 0x80) : blk(2, 2)[2]);
    for (int64_t o = ub + lb; o < ub + 2 * lb; ++o) ASSERT_EQ(dst[o], 0) << o;
  }
}

// Panel8 copies (load-time repack, AVX2): the shapes of PackedPanel16BitExact,
// bit-exact with the scalar reference (hence with the file layout for the
// quantized types, with the k-chain order for the float ones) at every thread
// count and batch size. The float batch sizes cover the small-n kernels
// (n = 1, 2, 3) and every tile height (n % 6), and 4608 columns span
// several k slices whose partial sums are parked in y.
TEST(Matmul, PackedPanel8BitExact) {
  if (!isa_available(Isa::Avx2)) GTEST_SKIP() << "AVX2 not available: Panel8 is not used here";
  IsaGuard g(Isa::Avx2);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                     GgmlType::F16, GgmlType::BF16, GgmlType::F32, GgmlType::MXFP4}) {
    // MXFP4's quad units: 1, 2 and 3 of the last unit's 4 blocks used.
    const std::vector<int64_t> widths = is_k(t) ? std::vector<int64_t>{4608, 256}
                                        : t == GgmlType::MXFP4 ? std::vector<int64_t>{4096 + 64, 4096 + 96, 32}
                                                               : std::vector<int64_t>{4608, 4096 + 96, 32};
    for (int64_t cols : widths) {
      const int64_t rows = 301;
      Weights W = make_weights(t, rows, cols, 13 + uint32_t(cols));
      std::vector<float> x = make_x(64, cols, 17);
      std::vector<float> ref(size_t(64 * rows));
      ASSERT_TRUE(packable(W.view));
      PackedArena arena = pack_weights({{&W.view, false}});
      ASSERT_EQ(W.view.pack, PackLayout::Panel8);
      matmul_q8_reference(W.view, x.data(), cols, 64, ref.data(), rows);  // k-chain for a float copy
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int64_t nn : {1, 2, 3, 4, 5, 7, 11, 16, 17, 33, 64}) {
          std::vector<float> y(size_t(nn * rows));
          matmul(W.view, x.data(), cols, nn, y.data(), rows, pool);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4))
              << type_name(t) << " cols=" << cols << " threads=" << threads << " n=" << nn;
        }
      }
    }
  }
}

// A float matrix packed for AVX2 (Panel8) and for AVX-512 (Panel16) runs the
// same k-chain order, so a worker of either kind returns the same bits. Each
// ISA path given the other's copy falls back to the plain k-chain code.
TEST(Matmul, FloatPanel8AndPanel16GiveTheSameBits) {
  const int64_t rows = 37, cols = 1056, n = 9;  // partial panels of both widths
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
    Weights W = make_weights(t, rows, cols, 5);
    std::vector<float> x = make_x(n, cols, 6);
    std::vector<float> ref(size_t(n * rows));
    ThreadPool pool(2);
    std::vector<std::vector<float>> got;
    for (PackLayout layout : {PackLayout::Panel8, PackLayout::Panel16}) {
      std::vector<uint8_t> copy(packed_size(W.view, layout) + 64);
      uint8_t* dst = copy.data() + (64 - reinterpret_cast<uintptr_t>(copy.data()) % 64) % 64;
      pack_panels_into(W.view, layout, dst);
      WeightView v = W.view;
      v.packed = dst;
      v.pack = layout;
      if (layout == PackLayout::Panel8) matmul_q8_reference(v, x.data(), cols, n, ref.data(), rows);
      for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
        if (!isa_available(isa)) continue;
        IsaGuard g(isa);
        std::vector<float> y(size_t(n * rows));
        matmul(v, x.data(), cols, n, y.data(), rows, pool);
        ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4))
            << type_name(t) << " " << isa_name(isa) << (layout == PackLayout::Panel8 ? " panel8" : " panel16");
      }
    }
  }
}

// One dispatch for several products of the same X (Q/K/V, gate/up), with
// mixed formats (Q4_K beside Q6_K, a float matrix, a packed one): each output
// is bit-identical to its own matmul().
TEST(Matmul, MultiEqualsSeparateProducts) {
  const int64_t cols = 512;
  Weights a = make_weights(GgmlType::Q4_K, 67, cols, 1), b = make_weights(GgmlType::Q6_K, 17, cols, 2);
  Weights c = make_weights(GgmlType::F16, 9, cols, 3), d = make_weights(GgmlType::Q8_0, 40, cols, 4);
  PackedArena arena = pack_weights({{&d.view, false}});
  const std::vector<Weights*> ws = {&a, &b, &c, &d};
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 64}) {
      std::vector<float> x = make_x(n, cols, uint32_t(n));
      std::vector<std::vector<float>> want(ws.size()), got(ws.size());
      std::vector<MatmulOut> outs;
      for (size_t j = 0; j < ws.size(); ++j) {
        const int64_t rows = ws[j]->view.rows;
        want[j].assign(size_t(n * rows), 0.0f);
        got[j].assign(size_t(n * rows), -1.0f);
        matmul(ws[j]->view, x.data(), cols, n, want[j].data(), rows, pool);
        outs.push_back({&ws[j]->view, got[j].data(), rows});
      }
      matmul_multi(outs.data(), int(outs.size()), x.data(), cols, n, pool);
      for (size_t j = 0; j < ws.size(); ++j)
        ASSERT_EQ(0, std::memcmp(got[j].data(), want[j].data(), got[j].size() * 4))
            << "output " << j << " threads=" << threads << " n=" << n;
    }
  }
  ThreadPool pool(2);
  Weights e = make_weights(GgmlType::Q4_0, 8, 256, 5);
  std::vector<float> x(512), ya(67), ye(8);
  MatmulOut bad[2] = {{&a.view, ya.data(), 67}, {&e.view, ye.data(), 8}};
  EXPECT_THROW(matmul_multi(bad, 2, x.data(), cols, 1, pool), std::invalid_argument);  // widths differ
}

// matmul_grouped: each group's Y equals matmul() of that group alone, bit
// for bit, on every ISA path, packed or not, whatever the other groups are
// (shared X between consecutive groups, empty groups, AMX-sized groups).
TEST(Matmul, GroupedEqualsSeparateProducts) {
  const int64_t cols = 512;
  Weights a = make_weights(GgmlType::Q4_K, 67, cols, 1), b = make_weights(GgmlType::Q6_K, 17, cols, 2);
  Weights c = make_weights(GgmlType::F16, 9, cols, 3), d = make_weights(GgmlType::Q8_0, 40, cols, 4);
  Weights e = make_weights(GgmlType::Q8_0, 33, cols, 5), f = make_weights(GgmlType::Q4_0, 21, cols, 6);
  Weights dn = make_weights(GgmlType::Q8_0, 48, 96, 7);  // another width
  for (bool packed : {false, true}) {
    PackedArena arena;
    if (packed) arena = pack_weights({{&a.view, false}, {&d.view, false}, {&e.view, false}, {&c.view, false}});
    // Groups: (weights, first X row, rows); e shares d's X (quantized once).
    struct G { Weights* w; int64_t x0, n; };
    const std::vector<G> gs = {{&a, 0, 5}, {&d, 5, 1}, {&e, 5, 1}, {&b, 6, 0}, {&c, 6, 3},
                               {&f, 9, 40}, {&d, 9, 40}, {&dn, 49, 2}};
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      IsaGuard guard(isa);
      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        std::vector<float> x = make_x(51, cols, 9);  // [51, cols]; dn reads the first 96 columns
        std::vector<std::vector<float>> want(gs.size()), got(gs.size());
        std::vector<MatmulGroup> groups;
        for (size_t j = 0; j < gs.size(); ++j) {
          const int64_t rows = gs[j].w->view.rows, n = gs[j].n;
          want[j].assign(size_t(n * rows), 0.0f);
          got[j].assign(size_t(n * rows) + 1, -1.0f);
          const float* xj = x.data() + gs[j].x0 * cols;
          matmul(gs[j].w->view, xj, cols, n, want[j].data(), rows, pool);
          groups.push_back({&gs[j].w->view, xj, cols, n, got[j].data(), rows});
        }
        matmul_grouped(groups.data(), int(groups.size()), pool);
        for (size_t j = 0; j < gs.size(); ++j) {
          ASSERT_EQ(0, std::memcmp(got[j].data(), want[j].data(), want[j].size() * 4))
              << "group " << j << " " << isa_name(isa) << " threads=" << threads << " packed=" << packed;
          EXPECT_EQ(got[j].back(), -1.0f);  // nothing written past the group's rows
        }
      }
    }
  }
  ThreadPool pool(2);
  std::vector<float> x(8), y(67);
  MatmulGroup bad{&a.view, x.data(), 8, 1, y.data(), 67};  // ldx < cols
  EXPECT_THROW(matmul_grouped(&bad, 1, pool), std::invalid_argument);
  matmul_grouped(nullptr, 0, pool);  // nothing to do
}

// Every decode variant (panels per pass, prefetch distance) of both packed
// layouts gives the reference's bits: the per-machine choice is speed only.
TEST(Matmul, EveryDecodeVariantBitExact) {
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (!isa_available(isa)) continue;
    IsaGuard g(isa);
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                       GgmlType::F16, GgmlType::BF16, GgmlType::F32, GgmlType::MXFP4}) {
      const int64_t rows = 8 * 16 + 24 + 5, cols = is_k(t) ? 512 : 96;  // 4-, 2- and 1-panel passes, a tail
      Weights W = make_weights(t, rows, cols, 21);
      std::vector<float> x = make_x(1, cols, 4);
      std::vector<float> ref(static_cast<size_t>(rows));
      PackedArena arena = pack_weights({{&W.view, false}});
      ASSERT_EQ(W.view.pack, pack_layout_for(isa));
      matmul_q8_reference(W.view, x.data(), cols, 1, ref.data(), rows);  // k-chain for a float copy
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        for (const DecodeVariant& v : decode_variants()) {
          set_decode_variant(t, v);
          std::vector<float> y(size_t(rows), -1.0f);
          matmul(W.view, x.data(), cols, 1, y.data(), rows, pool);
          EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4))
              << isa_name(isa) << " " << type_name(t) << " " << to_string(v) << " threads=" << threads;
        }
      }
    }
  }
  reset_decode_variants();
  EXPECT_EQ(decode_variant(GgmlType::Q4_0), DecodeVariant{});
  EXPECT_TRUE(decode_variants_apply(GgmlType::F16, PackLayout::Panel8));
  EXPECT_FALSE(decode_variants_apply(GgmlType::F16, PackLayout::Panel16));
  EXPECT_TRUE(decode_variants_apply(GgmlType::Q4_K, PackLayout::Panel16));
  EXPECT_FALSE(decode_variants_apply(GgmlType::Q4_0, PackLayout::None));
  EXPECT_THROW(set_decode_variant(GgmlType::Q4_0, DecodeVariant{3, 0}), std::invalid_argument);
}

// The documented Panel8 byte layout (weight_pack.h), at named offsets.
TEST(Matmul, PackedPanel8Layout) {
  const int64_t rows = 9, cols = 96;  // 2 panels, 3 blocks = 2 pair units (the last half empty)
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    Weights W = make_weights(t, rows, cols, 5);
    const bool q8 = t == GgmlType::Q8_0;
    const int64_t lb = q8 ? 256 : 128, ub = 2 * lb + 32, pbytes = 2 * ub;
    ASSERT_EQ(packed_size(W.view, PackLayout::Panel8), size_t(2 * pbytes));
    std::vector<uint8_t> dst(packed_size(W.view, PackLayout::Panel8));
    pack_panels_into(W.view, PackLayout::Panel8, dst.data());
    auto blk = [&](int64_t r, int64_t b) { return W.view.row(r) + b * (q8 ? 34 : 18); };
    // Panel 0, block 1 (second half of unit 0), row 5, vector 3: signed Q8_0 levels, no offset.
    for (int j = 0; j < 4; ++j) EXPECT_EQ(dst[lb + 32 * 3 + 4 * 5 + j], blk(5, 1)[2 + 12 + j]) << type_name(t);
    // Its fp16 scale: after both level blocks, second group of 8.
    EXPECT_EQ(0, std::memcmp(dst.data() + 2 * lb + 16 + 2 * 5, blk(5, 1), 2));
    // Panel 1 holds row 8 in lane 0 and repeats it in lanes 1..7.
    for (int lane : {0, 1, 7}) EXPECT_EQ(0, std::memcmp(dst.data() + pbytes + 2 * lb + 2 * lane, blk(8, 0), 2));
    // Block 2 lives in unit 1; the unit's second half is zero.
    EXPECT_EQ(dst[size_t(ub + 4 * 2)], blk(2, 2)[2]);
    for (int64_t o = ub + lb; o < ub + 2 * lb; ++o) ASSERT_EQ(dst[size_t(o)], 0) << o;
  }
  // Q4_K: the decoded scale j = 3 of row 6 at 132L + L*j + lane, d at 128L.
  Weights K = make_weights(GgmlType::Q4_K, 8, 256, 9);
  std::vector<uint8_t> dk(packed_size(K.view, PackLayout::Panel8));
  ASSERT_EQ(dk.size(), size_t(148 * 8));
  pack_panels_into(K.view, PackLayout::Panel8, dk.data());
  const auto* b6 = reinterpret_cast<const BlockQ4_K*>(K.view.row(6));
  uint8_t sc, mn;
  detail::get_scale_min_k4(3, b6->scales, &sc, &mn);
  EXPECT_EQ(dk[132 * 8 + 8 * 3 + 6], sc);
  EXPECT_EQ(dk[140 * 8 + 8 * 3 + 6], mn);
  EXPECT_EQ(0, std::memcmp(dk.data() + 128 * 8 + 2 * 6, &b6->d, 2));
  // Q5_K: the Q4_K unit, then qh vector k = 5 of row 6 at 148L + 4L*k + 4*lane.
  Weights K5 = make_weights(GgmlType::Q5_K, 8, 256, 10);
  std::vector<uint8_t> d5(packed_size(K5.view, PackLayout::Panel8));
  ASSERT_EQ(d5.size(), size_t(180 * 8));
  pack_panels_into(K5.view, PackLayout::Panel8, d5.data());
  const auto* c6 = reinterpret_cast<const BlockQ5_K*>(K5.view.row(6));
  EXPECT_EQ(0, std::memcmp(d5.data() + 148 * 8 + 32 * 5 + 4 * 6, c6->qh + 20, 4));
  EXPECT_EQ(0, std::memcmp(d5.data() + 32 * 7 + 4 * 6, c6->qs + 28, 4));
  EXPECT_EQ(0, std::memcmp(d5.data() + 130 * 8 + 2 * 6, &c6->dmin, 2));
}

// MXFP4 weights of every exponent byte (row r has e = r in each block, so
// e = 0 and 1 give subnormal scales and 255 the largest, 2^127) with random
// codes: every ISA path, file layout and packed copy, gives the scalar
// reference's bits. Activations near 2^-20 keep the largest rows finite
// while the smallest rows' products underflow through the subnormals.
TEST(Matmul, Mxfp4EveryExponentBitExact) {
  std::mt19937 rng(3);
  for (int64_t cols : {96, 256}) {
    const int64_t rows = 256, nb = cols / 32;
    Weights W;
    W.bytes.resize(size_t(rows * nb * 17));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* blk = W.bytes.data() + (r * nb + b) * 17;
        blk[0] = uint8_t(r);
        for (int j = 1; j < 17; ++j) blk[j] = uint8_t(rng());
      }
    W.view = {GgmlType::MXFP4, W.bytes.data(), rows, cols, size_t(nb * 17)};
    std::vector<float> x = make_x(13, cols, 9);
    for (float& v : x) v *= 0x1p-20f;
    std::vector<float> ref(size_t(13 * rows));
    matmul_q8_reference(W.view, x.data(), cols, 13, ref.data(), rows);
    int subnormal = 0;
    for (float v : ref) subnormal += std::fpclassify(v) == FP_SUBNORMAL;
    EXPECT_GT(subnormal, 0) << "no subnormal results: the test lost its edge";
    ThreadPool pool(2);
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      IsaGuard g(isa);
      Weights P = W;
      P.view.data = P.bytes.data();
      PackedArena arena;
      if (isa != Isa::Scalar) {
        arena = pack_weights({{&P.view, false}});
        ASSERT_EQ(P.view.pack, pack_layout_for(isa));
      }
      for (const WeightView* v : {&W.view, &P.view})
        for (int64_t n : {int64_t(1), int64_t(4), int64_t(13)}) {
          std::vector<float> y(size_t(n * rows));
          matmul(*v, x.data(), cols, n, y.data(), rows, pool);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4))
              << isa_name(isa) << " cols=" << cols << " n=" << n << (v->pack != PackLayout::None ? " packed" : "");
        }
    }
  }
}

// The documented MXFP4 layout of both copies (weight_pack.h): quad units of
// 4 blocks' nibble bytes then their exponent bytes, the same bytes as the
// file; 5 blocks leave 3 of the second unit's 4 empty (zero).
TEST(Matmul, PackedMxfp4Layout) {
  const int64_t cols = 160;  // 5 blocks
  for (PackLayout layout : {PackLayout::Panel16, PackLayout::Panel8}) {
    const int64_t L = layout == PackLayout::Panel16 ? 16 : 8, rows = L + 1;  // 2 panels
    Weights W = make_weights(GgmlType::MXFP4, rows, cols, 5);
    const int64_t lb = 16 * L, ub = 4 * (lb + L), pbytes = 2 * ub;
    ASSERT_EQ(ub, 17 * 4 * L);  // the file's bytes, no padding
    ASSERT_EQ(packed_size(W.view, layout), size_t(2 * pbytes));
    std::vector<uint8_t> dst(packed_size(W.view, layout));
    pack_panels_into(W.view, layout, dst.data());
    auto blk = [&](int64_t r, int64_t b) { return W.view.row(r) + b * 17; };
    const int64_t r = L - 3;
    // Block 2, row r, vector 3 (nibble bytes 12..15), then its exponent byte.
    for (int j = 0; j < 4; ++j) EXPECT_EQ(dst[size_t(2 * lb + 4 * L * 3 + 4 * r + j)], blk(r, 2)[1 + 12 + j]) << L;
    EXPECT_EQ(dst[size_t(4 * lb + 2 * L + r)], blk(r, 2)[0]) << L;
    // Block 4 opens unit 1; blocks 5..7 of it are zero, levels and exponents.
    EXPECT_EQ(dst[size_t(ub + 4 * r)], blk(r, 4)[1]);
    EXPECT_EQ(dst[size_t(ub + 4 * lb + r)], blk(r, 4)[0]);
    for (int64_t o = ub + lb; o < ub + 4 * lb; ++o) ASSERT_EQ(dst[size_t(o)], 0) << o;
    for (int64_t o = ub + 4 * lb + L; o < 2 * ub; ++o) ASSERT_EQ(dst[size_t(o)], 0) << o;
    // Panel 1 holds the last row in lane 0 and repeats it in every lane.
    for (int64_t lane : {int64_t(0), int64_t(1), L - 1}) EXPECT_EQ(dst[size_t(pbytes + 4 * lb + lane)], blk(L, 0)[0]);
  }
}

// The float Panel16 layout: element k of panel p's 16 rows at [16k, 16k + 16).
TEST(Matmul, PackedPanel16FloatLayout) {
  const int64_t rows = 17, cols = 5;  // 2 panels, the second holds row 16 and repeats it
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
    Weights W = make_weights(t, rows, cols, 3);
    const int64_t es = t == GgmlType::F32 ? 4 : 2;
    ASSERT_EQ(packed_size(W.view, PackLayout::Panel16), size_t(2 * cols * 16 * es));
    std::vector<uint8_t> dst(packed_size(W.view, PackLayout::Panel16));
    pack_panel16(W.view, dst.data());
    for (int64_t k : {0, 3, 4})
      for (int64_t lane : {0, 5, 15}) {
        EXPECT_EQ(0, std::memcmp(dst.data() + (k * 16 + lane) * es, W.view.row(lane) + k * es, size_t(es)));
        EXPECT_EQ(0, std::memcmp(dst.data() + (cols * 16 + k * 16 + lane) * es, W.view.row(16) + k * es,
                                 size_t(es)));
      }
  }
}

// The float Panel8 layout: element k of panel p's 8 rows at [8k, 8k + 8).
// 19 columns: two 8 x 8 register transposes and a tail of three.
TEST(Matmul, PackedPanel8FloatLayout) {
  const int64_t rows = 9, cols = 19;  // 2 panels, the second holds row 8 and repeats it
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
    Weights W = make_weights(t, rows, cols, 3);
    const int64_t es = t == GgmlType::F32 ? 4 : 2;
    ASSERT_EQ(packed_size(W.view, PackLayout::Panel8), size_t(2 * cols * 8 * es));
    std::vector<uint8_t> dst(packed_size(W.view, PackLayout::Panel8));
    pack_panels_into(W.view, PackLayout::Panel8, dst.data());
    for (int64_t k : {0, 3, 4, 7, 8, 15, 16, 18})
      for (int64_t lane : {0, 5, 7}) {
        EXPECT_EQ(0, std::memcmp(dst.data() + (k * 8 + lane) * es, W.view.row(lane) + k * es, size_t(es)));
        EXPECT_EQ(0, std::memcmp(dst.data() + (cols * 8 + k * 8 + lane) * es, W.view.row(8) + k * es,
                                 size_t(es)));
      }
  }
}

// Batches too large for the float GEMM's k-slice state (n * 4 rows * 64 B >
// scratch) take the unsliced path; results must not change.
TEST(Matmul, HugeBatch) {
  for (GgmlType t : {GgmlType::F16, GgmlType::Q4_0, GgmlType::MXFP4}) {
    const int64_t rows = 9, cols = 96, n = 2100;
    Weights W = make_weights(t, rows, cols, 17);
    std::vector<float> x = make_x(n, cols, 4);
    std::vector<float> ref(size_t(n * rows)), y(size_t(n * rows));
    matmul_q8_reference(W.view, x.data(), cols, n, ref.data(), rows);
    ThreadPool pool(2);
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      IsaGuard g(isa);
      matmul(W.view, x.data(), cols, n, y.data(), rows, pool);
      ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4)) << type_name(t) << " " << isa_name(isa);
    }
  }
}

// Every ISA's activation quantizer writes the scalar one's XBlocks, byte
// for byte: rows of 1 to 177 blocks (the 16-block groups and the tail),
// all-zero blocks, a wide range of magnitudes, every weight convention.
TEST(Matmul, QuantizeXBitExactAcrossIsas) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> ex(-40, 40);
  const mm::IsaKernels* isas[] = {&mm::avx2_kernels(), &mm::avx512_kernels()};
  const bool have[] = {active_isa() >= Isa::Avx2, active_isa() >= Isa::Avx512};
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    for (int nb : {1, 15, 16, 17, 33, 64, 177}) {
      const int64_t cols = 32 * int64_t(nb);
      std::vector<float> x(static_cast<size_t>(cols));
      for (int b = 0; b < nb; ++b) {
        const float scale = std::ldexp(1.0f, ex(rng));
        for (int i = 0; i < 32; ++i) x[size_t(32 * b + i)] = b % 7 == 3 ? 0.0f : nd(rng) * scale;
      }
      std::vector<mm::XBlock> want(static_cast<size_t>(nb)), got(static_cast<size_t>(nb));
      for (int k = 0; k < 2; ++k) {
        if (!have[k]) continue;
        const mm::QFormat f = mm::qformat(t, isas[k]->signed_q8);
        mm::quantize_x_scalar(x.data(), cols, f, want.data());
        std::memset(static_cast<void*>(got.data()), 0xAB, got.size() * sizeof(mm::XBlock));
        isas[k]->quantize_x(x.data(), cols, f, got.data());
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(mm::XBlock)))
            << type_name(t) << " blocks " << nb << " isa " << k;
      }
    }
}

TEST(Matmul, DequantizeWeightRow) {
  for (GgmlType t : kAllTypes) {
    const int64_t cols = 512;
    Weights W = make_weights(t, 5, cols, 3, 4);
    std::vector<float> a(cols), b(cols);
    for (int64_t r = 0; r < 5; ++r) {
      dequantize_weight_row(W.view, r, a.data());
      dequantize_row(t, W.view.row(r), b.data(), cols);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), cols * 4)) << type_name(t);
    }
    EXPECT_THROW(dequantize_weight_row(W.view, 5, a.data()), std::out_of_range);
  }
}

TEST(Matmul, RejectsBadArguments) {
  ThreadPool pool(1);
  Weights W = make_weights(GgmlType::Q4_0, 4, 64, 1);
  std::vector<float> x(64), y(4);
  WeightView v = W.view;
  v.cols = 48;  // not a multiple of 32
  EXPECT_THROW(matmul(v, x.data(), 64, 1, y.data(), 4, pool), std::invalid_argument);
  v = W.view;
  v.type = GgmlType::Q2_K;
  EXPECT_THROW(matmul(v, x.data(), 64, 1, y.data(), 4, pool), std::invalid_argument);
  EXPECT_THROW(matmul(W.view, x.data(), 32, 1, y.data(), 4, pool), std::invalid_argument);
}

TEST(Cpu, OverrideClampsAndRestores) {
  const Isa best = active_isa();
  set_isa_override(Isa::Scalar);
  EXPECT_EQ(active_isa(), Isa::Scalar);
  set_isa_override(Isa::Avx512);
  EXPECT_LE(int(active_isa()), int(Isa::Avx512));
  clear_isa_override();
  EXPECT_EQ(active_isa(), best);
  const CpuFeatures& f = cpu_features();
  if (f.avx512f) {
    EXPECT_TRUE(f.avx2);
  }
  EXPECT_GE(f.logical_cores, 1);
  std::printf("  best ISA here: %s (avx512vnni=%d avx512bf16=%d avxvnni=%d)\n",
              isa_name(best).c_str(), f.avx512vnni, f.avx512bf16, f.avxvnni);
}

}  // namespace
}  // namespace kvs
