// Whether the tile unit and the vector unit overlap: one step of the K-quant
// tile kernel (kernels/matmul_amx_super_step.h, the very functions
// matmul_amx_super.cpp runs), the products of a super-block and the float
// chain of the previous one, timed apart and in two orders, on one thread.
// A step is 16 activation rows x 16 weight rows x 256 elements (65,536
// multiply-adds):
//   products  the stores of the previous step's sums, then four K = 64
//             steps, each an activation tile load (from a ring of 64
//             super-blocks, which stays in L2 as a prefill chunk's does),
//             lo and hi weight tile loads (L1) and two tile products
//   chain     Q4_K's float chain alone: per row the lo / hi sums combined,
//             converted, scaled, the mins' four int16 dot products, two FMAs
//   after     the products, then the whole chain (the kernel's order before
//             the fourteenth session)
//   between   the chain in four pieces, one after each K = 64 step (the
//             kernel's order now)
// The data are random (the tile unit's rate depends on them); the results
// are not checked, only timed. docs/PERFORMANCE.md reads the counters.
// Run: build/bench_amx_overlap
#include <benchmark/benchmark.h>
#include <x86intrin.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/matmul_amx_super_step.h"
#include "kernels/matmul_amx_tiles.h"

namespace {

using namespace kvs::mm;
using namespace kvs::mm::super_step;

constexpr int64_t kRing = 64;  // activation super-blocks cycled through

struct Data {
  std::vector<XSuper> x = std::vector<XSuper>(kRing);
  std::vector<uint8_t> raw = std::vector<uint8_t>(kSuperBytes + 64);
  uint8_t* slice;  // one super-block of the kernel's slice
  alignas(64) int32_t ring[2][512];
  Data() {
    slice = raw.data() + (64 - reinterpret_cast<uintptr_t>(raw.data()) % 64) % 64;
    std::mt19937 rng(11);
    for (XSuper& s : x)
      for (int m = 0; m < 16; ++m) {
        for (auto& q : s.q[m]) q = int8_t(rng());
        s.d[m] = 0.01f + 0.001f * float(rng() % 16);
        for (auto& v : s.xs[m]) v = int16_t(rng() % 4000);
      }
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 1024; ++i) lo_of(slice, 0, c)[i] = uint8_t(rng()), hi_of(slice, 0, c)[i] = uint8_t(rng() % 8);
    for (int r = 0; r < 16; ++r) d_of(slice, 0)[r] = 0.02f, nd_of(slice, 0)[r] = -0.01f;
    for (int i = 0; i < 64; ++i) mins_of(slice, 0)[i] = int32_t(rng() % 64) | int32_t(rng() % 64) << 16;
    for (auto& r : ring)
      for (auto& v : r) v = int32_t(rng() % 65536);
  }
};

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c,bmi,bmi2,popcnt,amx-tile,amx-int8")

// MODE 0: products; 1: chain; 2: products, then the chain; 3: the chain
// between the product steps. TSC ticks per step.
template <int MODE>
__attribute__((noinline)) double run_steps(Data& d, int64_t steps, float* out) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const SuperConsts kc = super_consts<true>(d.slice, 0);
  const uint64_t t0 = __rdtsc();
  for (int64_t k = 0; k < steps; ++k) {
    const XSuper& xp = d.x[size_t((k + kRing - 1) % kRing)];  // the chain's: the step before
    const int32_t* c = d.ring[k % 2];
    if constexpr (MODE != 1) {
      super_store(k, d.ring[k % 2]);
      super_product(k + 1, &d.x[size_t(k % kRing)], d.slice, 0, [&](int s) __attribute__((always_inline)) {
        if constexpr (MODE == 3) super_chain<true, true>(c, kc, xp, 16, 4 * s, 4 * s + 4, acc);
      });
    }
    if constexpr (MODE == 1 || MODE == 2) super_chain<true, true>(c, kc, xp, 16, 0, 16, acc);
  }
  const uint64_t t1 = __rdtsc();
  for (int m = 0; m < 16; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
  return double(t1 - t0) / double(steps);
}
KVS_TARGET_END()

template <int MODE>
void BM_step(benchmark::State& state) {
  if (kvs::active_isa() != kvs::Isa::Amx) {
    state.SkipWithError("no AMX here (or KVS_ISA lowered it, or the kernel refused the tile permission)");
    return;
  }
  Data d;
  std::vector<float> out(256);
  constexpr int64_t kSteps = 4096;
  kvs::mm::amx_detail::TileScope tiles(kvs::mm::amx_detail::TileMode::Super);
  double ticks = 0.0;
  int64_t runs = 0;
  for (auto _ : state) {
    ticks += run_steps<MODE>(d, kSteps, out.data());
    ++runs;
  }
  benchmark::DoNotOptimize(out.data());
  state.counters["tsc/step"] = ticks / double(runs);
  state.counters["GMAC/s"] = benchmark::Counter(65536.0 * double(kSteps * runs) / 1e9, benchmark::Counter::kIsRate);
}

BENCHMARK(BM_step<0>)->Name("products");
BENCHMARK(BM_step<1>)->Name("chain");
BENCHMARK(BM_step<2>)->Name("after");
BENCHMARK(BM_step<3>)->Name("between");

}  // namespace

BENCHMARK_MAIN();
