// In-L1 speed of the AVX2 quantized block kernels that the Q8_0 and Q4_0
// GEMMs (prefill, batched decode) spend their time in: 16 blocks of 8 weight
// rows (4 KB) against 4 activation rows, all cache-resident, so the figure
// is the instruction mix's own ceiling on this CPU. A whole GEMM can only
// approach it (docs/PERFORMANCE.md compares the two against llama.cpp).
//   GOP/s = 2 * 8 rows * 32 * 4 activation rows * blocks per second.
// Run: build/bench_tiles
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/matmul_avx2_block.h"

namespace {

using namespace kvs;
using namespace kvs::mm;
using namespace kvs::mm::avx2_detail;

constexpr int kBlocks = 16;
constexpr int kRows = 4;  // activation rows per tile, as the GEMM's

KVS_TARGET_BEGIN("avx2,fma,f16c,bmi,bmi2,popcnt")

// One pass over the blocks; the accumulators live in `out` between passes.
__attribute__((noinline)) void q8_pass(const uint8_t* lev, const XBlock* xq, float* out) {
  __m256 acc[kRows];
  for (int i = 0; i < kRows; ++i) acc[i] = _mm256_loadu_ps(out + 8 * i);
  const __m256 ws = _mm256_set1_ps(0.01f);
  for (int b = 0; b < kBlocks; ++b) {
    const XBlock* xb[kRows];
    for (int i = 0; i < kRows; ++i) xb[i] = &xq[i * kBlocks + b];
    signed_block_rows<kRows>(lev + 256 * b, ws, xb, acc);
  }
  for (int i = 0; i < kRows; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

__attribute__((noinline)) void q4_pass(const uint8_t* lev, const XBlock* xq, float* out) {
  __m256 acc[kRows];
  for (int i = 0; i < kRows; ++i) acc[i] = _mm256_loadu_ps(out + 8 * i);
  const __m256 ws = _mm256_set1_ps(0.01f);
  for (int b = 0; b < kBlocks; ++b) {
    __m256i W[8];
    for (int k = 0; k < 8; ++k) W[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lev + 256 * b + 32 * k));
    for (int i = 0; i < kRows; ++i)
      acc[i] = block_step<false, false, false, 4>(W, ws, ws, ws, xq[i * kBlocks + b], acc[i]);
  }
  for (int i = 0; i < kRows; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

KVS_TARGET_END()

template <bool Q8>
void BM_Tile(benchmark::State& state) {
  if (!cpu_features().avx2 || !cpu_features().fma || !cpu_features().f16c) {
    state.SkipWithError("AVX2 not available");
    return;
  }
  alignas(64) static uint8_t lev[256 * kBlocks];
  std::mt19937 rng(7);
  // Q8_0: signed levels; Q4_0: unpacked nibbles (0..15), as the kernels see them.
  for (auto& v : lev) v = Q8 ? uint8_t(int(rng() % 255) - 127) : uint8_t(rng() & 0x0F);
  std::vector<XBlock> xq(size_t(kRows * kBlocks));
  for (auto& x : xq) {
    x.d = 0.5f;
    x.s = 0.0f;
    x.corr[0] = 3;
    x.corr[1] = 0;
    for (auto& q : x.q) q = int8_t(int(rng() % 255) - 127);
  }
  alignas(32) float out[8 * kRows] = {};
  for (auto _ : state) {
    if (Q8) q8_pass(lev, xq.data(), out);
    else q4_pass(lev, xq.data(), out);
  }
  benchmark::DoNotOptimize(out);
  state.counters["GOP/s"] = benchmark::Counter(2.0 * 8 * 32 * kRows * kBlocks, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_Tile<true>)->Name("Q8_0_avx2_tile_in_L1");
BENCHMARK(BM_Tile<false>)->Name("Q4_0_avx2_tile_in_L1");

}  // namespace
