// Whether the tile unit and the vector unit overlap: one step of the K-quant
// tile kernel (kernels/matmul_amx_super.cpp), the products of a super-block
// and the float chain of the previous one, timed apart and in two orders,
// on one thread. A step is 16 activation rows x 16 weight rows x 256
// elements (65,536 multiply-adds):
//   products  four K = 64 steps, each an activation tile load (from a ring
//             of 64 super-blocks, which stays in L2 as a prefill chunk's
//             does), lo and hi weight tile loads (L1) and two tdp products,
//             then the two tile stores of the previous step's sums
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
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/matmul_amx_tiles.h"

namespace {

using namespace kvs::mm::amx_detail;

constexpr int64_t kSuper = 5120;  // bytes between activation super-blocks (XSuper)
constexpr int64_t kRing = 64;     // activation super-blocks cycled through
constexpr int64_t kQBytes = 4096; // their levels; then 16 row scales and [16][8] int16 block sums

struct Data {
  std::vector<uint8_t> xraw = std::vector<uint8_t>(kRing * kSuper + 64);
  uint8_t* x;
  alignas(64) uint8_t lo[4][1024], hi[4][1024];
  alignas(64) int32_t ring[2][512];
  alignas(64) float vd[16], vnd[16];
  alignas(64) int32_t mins[4][16];
  Data() {
    x = xraw.data() + (64 - reinterpret_cast<uintptr_t>(xraw.data()) % 64) % 64;
    std::mt19937 rng(11);
    for (auto& b : xraw) b = uint8_t(rng());
    for (int64_t i = 0; i < kRing; ++i) {  // each super-block's row scales and block sums, as XSuper
      float* xd = reinterpret_cast<float*>(x + i * kSuper + kQBytes);
      int16_t* xs = reinterpret_cast<int16_t*>(xd + 16);
      for (int m = 0; m < 16; ++m) xd[m] = 0.01f + 0.001f * float(rng() % 16);
      for (int j = 0; j < 16 * 8; ++j) xs[j] = int16_t(rng() % 4000);
    }
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 1024; ++i) lo[c][i] = uint8_t(rng()), hi[c][i] = uint8_t(rng() % 8);
    for (auto& r : ring)
      for (auto& v : r) v = int32_t(rng() % 65536);
    for (int m = 0; m < 16; ++m) {
      vd[m] = 0.02f, vnd[m] = -0.01f;
      for (int p = 0; p < 4; ++p) mins[p][m] = int32_t(rng() % 64) | int32_t(rng() % 64) << 16;
    }
  }
};

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2,popcnt,amx-tile,amx-int8")
#define KVS_INL inline __attribute__((always_inline))

// Rows [m0, m1) of the chain: the kernel's super_chain with MIN; xa the
// super-block's activations (row scales and block sums after the levels).
KVS_INL void chain(const Data& d, const uint8_t* xa, const int32_t* c, int m0, int m1, __m512* acc) {
  const float* xdv = reinterpret_cast<const float*>(xa + kQBytes);
  const int16_t* xs = reinterpret_cast<const int16_t*>(xdv + 16);
  const __m512 vd = _mm512_load_ps(d.vd), vnd = _mm512_load_ps(d.vnd);
  __m512i mp[4];
  for (int p = 0; p < 4; ++p) mp[p] = _mm512_load_si512(d.mins[p]);
#pragma GCC unroll 16
  for (int m = m0; m < m1; ++m) {
    const __m512i s =
        _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c + 256 + 16 * m), 8), _mm512_load_si512(c + 16 * m));
    const __m512 xd = _mm512_set1_ps(xdv[m]);
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(vd, xd), acc[m]);
    int32_t v;
    std::memcpy(&v, xs + 8 * m, 4);
    __m512i mm = _mm512_madd_epi16(mp[0], _mm512_set1_epi32(v));
    for (int p = 1; p < 4; ++p) {
      std::memcpy(&v, xs + 8 * m + 2 * p, 4);
      mm = _mm512_dpwssd_epi32(mm, mp[p], _mm512_set1_epi32(v));
    }
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mm), _mm512_mul_ps(vnd, xd), acc[m]);
  }
}

#define KVS_STEP(CL, CH, A, c)                   \
  KVS_TILE_LOAD(A, xa + 64 * c, 256, 3904);      \
  KVS_TILE_LOAD(6, d.lo[c], 64, 1024);           \
  _tile_dpbsud(CL, A, 6);                        \
  KVS_TILE_LOAD(7, d.hi[c], 64, 1024);           \
  _tile_dpbssd(CH, A, 7);                        \
  if constexpr (MODE == 3) chain(d, xp, cur, 4 * c, 4 * c + 4, acc);
#define KVS_SUPER(CL, CH, SL, SH) \
  KVS_TILE_STORE(SL, cur);        \
  KVS_TILE_STORE(SH, cur + 256);  \
  _tile_zero(CL);                 \
  _tile_zero(CH);                 \
  KVS_STEP(CL, CH, 4, 0)          \
  KVS_STEP(CL, CH, 5, 1)          \
  KVS_STEP(CL, CH, 4, 2)          \
  KVS_STEP(CL, CH, 5, 3)

// MODE 0: products; 1: chain; 2: products, then the chain; 3: the chain
// between the product steps. TSC ticks per step.
template <int MODE>
__attribute__((noinline)) double run_steps(Data& d, int64_t steps, float* out) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const uint64_t t0 = __rdtsc();
  for (int64_t k = 0; k < steps; ++k) {
    const uint8_t* xa = d.x + (k % kRing) * kSuper;              // this step's products
    const uint8_t* xp = d.x + ((k + kRing - 1) % kRing) * kSuper;  // the chain's: the step before
    int32_t* cur = d.ring[k % 2];
    if constexpr (MODE != 1) {
      if (k % 2) {
        KVS_SUPER(0, 1, 2, 3)
      } else {
        KVS_SUPER(2, 3, 0, 1)
      }
    }
    if constexpr (MODE == 1 || MODE == 2) chain(d, xp, cur, 0, 16, acc);
  }
  const uint64_t t1 = __rdtsc();
  for (int m = 0; m < 16; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
  return double(t1 - t0) / double(steps);
}
#undef KVS_SUPER
#undef KVS_STEP
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
