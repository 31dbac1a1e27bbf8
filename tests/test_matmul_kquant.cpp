// The K-quants' super-block arithmetic (kernels/matmul_internal.h): their
// activations scaled per 256 elements, and the largest integer sums the
// kernels must carry, alike on every ISA path and weight copy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "kernels/threadpool.h"
#include "kernels/weight_pack.h"
#include "isa_guard.h"

namespace kvs {
namespace {

// The K-quants' activations take one scale per 256-element super-block
// (llama.cpp's Q8_K): the same xd in its 8 blocks, from the super-block's
// maximum, so the kernels can sum a super-block in integers first. Q4_K's
// blocks also carry their level sums (corr[1]) for the mins' integer sum.
TEST(Matmul, KQuantActivationsShareOneScalePerSuperBlock) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t cols = 512;
  std::vector<float> x(static_cast<size_t>(cols));
  for (auto& v : x) v = nd(rng);
  x[300] = 40.0f;  // the second super-block's maximum, in its second block
  std::vector<mm::XBlock> p(16);
  mm::quantize_x_scalar(x.data(), cols, mm::qformat(GgmlType::Q8_0), p.data());
  float amax0 = 0;
  for (int i = 0; i < 256; ++i) amax0 = std::max(amax0, std::fabs(x[size_t(i)]));
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q5_K}) {
    std::vector<mm::XBlock> q(16);
    mm::quantize_x_scalar(x.data(), cols, mm::qformat(t), q.data());
    for (int b = 0; b < 8; ++b) {
      EXPECT_EQ(q[size_t(b)].d, amax0 / 127.0f) << type_name(t) << " " << b;
      EXPECT_EQ(q[size_t(8 + b)].d, 40.0f / 127.0f) << type_name(t) << " " << b;
    }
    EXPECT_EQ(q[9].q[300 - 288], 127);
    EXPECT_NE(p[8].d, q[8].d) << "Q8_0 keeps one scale per 32-element block";
    if (t == GgmlType::Q6_K) continue;
    for (int b = 0; b < 16; ++b) {
      int sum = 0;
      for (int e = 0; e < 32; ++e) sum += q[size_t(b)].q[e];
      EXPECT_EQ(q[size_t(b)].corr[1], sum) << type_name(t) << " block " << b;
      EXPECT_EQ(q[size_t(b)].corr[0], 0) << "Q4_K / Q5_K levels have no offset";
    }
  }
}

// Every path (each ISA, file layout and packed copy) on w against the
// scalar reference, memcmp-equal, at decode, batched and prefill sizes.
void expect_alike_on_every_path(const WeightView& w) {
  const int64_t rows = w.rows, cols = w.cols;
  ThreadPool pool(2);
  for (int64_t n : {1, 7, 16, 40}) {
    std::vector<float> x(size_t(n * cols));
    for (size_t e = 0; e < x.size(); ++e) x[e] = (e / 3) % 2 ? 5.0f : -5.0f;
    std::vector<float> ref(size_t(n * rows)), y(ref.size());
    matmul_q8_reference(w, x.data(), cols, n, ref.data(), rows);
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      IsaGuard g(isa);
      for (bool packed : {false, true}) {
        WeightView v = w;
        PackedArena arena;
        if (packed && isa != Isa::Scalar && packable(v)) arena = pack_weights({{&v, false}});
        matmul(v, x.data(), cols, n, y.data(), rows, pool);
        EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4))
            << type_name(w.type) << " " << isa_name(isa) << " n=" << n << " packed=" << packed;
      }
    }
  }
}

// A [35, 512] K-quant matrix at its extremes: every scale and min 63, every
// level at its top (all level bits set; every third block's bytes random
// instead), d varying by block.
template <class Block>
WeightView extreme_kquant(GgmlType t, unsigned seed, std::vector<uint8_t>& bytes) {
  const int64_t rows = 35, cols = 512, n = rows * cols / 256;
  bytes.assign(size_t(n) * sizeof(Block), 0);
  auto* blk = reinterpret_cast<Block*>(bytes.data());
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    blk[i].d = f32_to_fp16(0.01f * float(1 + i % 5));
    blk[i].dmin = f32_to_fp16(0.02f);
    std::memset(blk[i].scales, 0xFF, sizeof blk[i].scales);  // sc = m = 63
    std::memset(blk[i].qs, i % 3 ? 0xFF : int(rng() & 0xFF), sizeof blk[i].qs);
    if constexpr (requires { blk[i].qh; }) std::memset(blk[i].qh, i % 3 ? 0xFF : int(rng() & 0xFF), sizeof blk[i].qh);
  }
  return WeightView{t, bytes.data(), rows, cols, size_t(cols / 256) * sizeof(Block)};
}

// Q4_K's arithmetic at its extremes: every level 15, activations all at
// +-127. The super-block sums S and M reach their largest values (S = 8 *
// 63 * 32 * 15 * 127 < 2^31), which the int16 pairs, the AMX byte split and
// vpmulld must all carry exactly.
TEST(Matmul, Q4KExtremeSumsAlikeOnEveryPath) {
  std::vector<uint8_t> bytes;
  expect_alike_on_every_path(extreme_kquant<BlockQ4_K>(GgmlType::Q4_K, 3, bytes));
}

// Q5_K's extremes: every level 31 (qs and qh all ones). A half block's sum
// then passes 2^15 (so not kblock's NIB path), and v = sc * q the AMX byte
// split's largest value.
TEST(Matmul, Q5KExtremeSumsAlikeOnEveryPath) {
  std::vector<uint8_t> bytes;
  expect_alike_on_every_path(extreme_kquant<BlockQ5_K>(GgmlType::Q5_K, 4, bytes));
}

}  // namespace
}  // namespace kvs
