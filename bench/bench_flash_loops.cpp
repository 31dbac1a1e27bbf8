// The inner loops of the AVX-512 tiled attention kernel
// (kernels/flash_rows_impl.h) alone, all in L1, one thread, and variants of
// them: what bounds the exact fp32 attention (docs/PERFORMANCE.md, seventh
// session). One unit is a row group (16 query rows, lanes = rows) against a
// 16-key tile at head_dim 64: 1,024 FMAs per loop.
//   regs        16 independent FMA chains, register operands only: the peak
//   scores      the kernel's score loop: per d, one query vector and 16 key
//               broadcasts from memory, 16 chains
//   scores_regk the same with the 16 keys held in registers: what the
//               broadcasts cost
//   values      the kernel's value loop: per key, 8 output chains and 8
//               value broadcasts, eight d at a time
//   scores4 / values4  four row groups at once: each broadcast feeds four
//               chains (4 query or p vectors + 4 broadcasts per 16 FMAs)
//   values_rows the value loop with the outputs row-major (lanes along d, as
//               the kernel keeps them for few rows): per key 4 value loads
//               and 4 p broadcasts feed 16 chains, half the loads of values
// Counter: GFLOP/s (2 per FMA lane).
// Run: build/bench_flash_loops
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstddef>

#include "kernels/cpu.h"
#include "kernels/target_region.h"

namespace {

constexpr int kHd = 64, kKeys = 16, kL = 16;

bool have_avx512(benchmark::State& st) {
  const kvs::Isa isa = kvs::active_isa();
  if (isa == kvs::Isa::Avx512 || isa == kvs::Isa::Amx) return true;
  st.SkipWithError("no AVX-512 here (or KVS_ISA lowered it)");
  return false;
}

struct alignas(64) Data {
  float k[kKeys * kHd];        // [16 keys, hd] a tile's keys (values too)
  float q[4][kHd * kL];        // [4 groups][hd, 16 lanes] scaled queries
  float o[4][kHd * kL];        // [4 groups][hd, 16 lanes] outputs
  float p[4][kKeys * kL];      // [4 groups][16 keys, 16 lanes] probabilities
  float s[4][kKeys * kL];      // scores out
  float orow[kL * kHd];        // [16 rows, hd] outputs, row-major (values_rows)
  Data() {
    for (int i = 0; i < kKeys * kHd; ++i) k[i] = 1e-4f * float(i % 97);
    for (int g = 0; g < 4; ++g) {
      for (int i = 0; i < kHd * kL; ++i) q[g][i] = 1e-3f, o[g][i] = 0.0f;
      for (int i = 0; i < kKeys * kL; ++i) p[g][i] = 1e-6f;
    }
  }
};

KVS_TARGET_BEGIN("avx512f,avx2,fma")

__attribute__((noinline)) void regs(Data& d) {
  __m512 acc[16];
  __m512 a = _mm512_load_ps(d.q[0]), b = _mm512_load_ps(d.q[1]);
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  for (int i = 0; i < kHd; ++i) {
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_fmadd_ps(a, b, acc[t]);
    __asm__("" : "+v"(a));
  }
  for (int t = 0; t < 16; ++t) _mm512_store_ps(d.s[0] + t * kL, acc[t]);
}

template <bool KeysInRegs>
__attribute__((noinline)) void scores(Data& d) {
  __m512 acc[16], kr[12];
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  for (int t = 0; t < 12; ++t) kr[t] = _mm512_set1_ps(d.k[t * kHd]);
#pragma GCC unroll 4
  for (int i = 0; i < kHd; ++i) {
    const __m512 x = _mm512_load_ps(d.q[0] + i * kL);
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t)
      acc[t] = _mm512_fmadd_ps(KeysInRegs ? kr[t % 12] : _mm512_set1_ps(d.k[t * kHd + i]), x, acc[t]);
  }
  for (int t = 0; t < 16; ++t) _mm512_store_ps(d.s[0] + t * kL, acc[t]);
}

__attribute__((noinline)) void values(Data& d) {
  for (int i = 0; i < kHd; i += 8) {
    __m512 a[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) a[j] = _mm512_load_ps(d.o[0] + (i + j) * kL);
#pragma GCC unroll 16
    for (int t = 0; t < kKeys; ++t) {
      const __m512 pt = _mm512_load_ps(d.p[0] + t * kL);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) a[j] = _mm512_fmadd_ps(_mm512_set1_ps(d.k[t * kHd + i + j]), pt, a[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) _mm512_store_ps(d.o[0] + (i + j) * kL, a[j]);
  }
}

// a[g][c] += broadcast(b[c * stride]) * v[g] for g, c < 4: each of four
// broadcasts feeds four chains.
inline __attribute__((always_inline)) void fma4x4(__m512 (*a)[4], const __m512* v, const float* b, int stride) {
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512 bc = _mm512_set1_ps(b[c * stride]);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) a[g][c] = _mm512_fmadd_ps(bc, v[g], a[g][c]);
  }
}

// a[g][c] from or to rows[g] + (c0 + c) * kL for g, c < 4.
template <int N>
inline __attribute__((always_inline)) void load4x4(__m512 (*a)[4], const float (*rows)[N], int c0) {
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) a[g][c] = _mm512_load_ps(rows[g] + (c0 + c) * kL);
}
template <int N>
inline __attribute__((always_inline)) void store4x4(const __m512 (*a)[4], float (*rows)[N], int c0) {
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) _mm512_store_ps(rows[g] + (c0 + c) * kL, a[g][c]);
}

__attribute__((noinline)) void scores4(Data& d) {
  for (int kb = 0; kb < kKeys; kb += 4) {
    __m512 a[4][4];
    for (auto& row : a)
      for (auto& x : row) x = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int i = 0; i < kHd; ++i) {
      __m512 x[4];
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) x[g] = _mm512_load_ps(d.q[g] + i * kL);
      fma4x4(a, x, d.k + kb * kHd + i, kHd);  // keys kb .. kb + 3 at d = i
    }
    store4x4(a, d.s, kb);
  }
}

__attribute__((noinline)) void values4(Data& d) {
  for (int i = 0; i < kHd; i += 4) {
    __m512 a[4][4];
    load4x4(a, d.o, i);
#pragma GCC unroll 2
    for (int t = 0; t < kKeys; ++t) {
      __m512 pg[4];
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        pg[g] = _mm512_load_ps(d.p[g] + t * kL);
        __asm__("" : "+v"(pg[g]));  // one load per key, not one per FMA
      }
      fma4x4(a, pg, d.k + t * kHd + i, 1);  // key t's values at d = i .. i + 3
    }
    store4x4(a, d.o, i);
  }
}

// Outputs row-major (lanes along d), four rows x four d vectors at a time:
// per key four value loads and four p broadcasts feed sixteen chains.
__attribute__((noinline)) void values_rows(Data& d) {
  for (int j0 = 0; j0 < kL; j0 += 4) {
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) a[j][c] = _mm512_load_ps(d.orow + (j0 + j) * kHd + 16 * c);
#pragma GCC unroll 4
    for (int t = 0; t < kKeys; ++t) {
      __m512 v[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) v[c] = _mm512_load_ps(d.k + t * kHd + 16 * c);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512 pj = _mm512_set1_ps(d.p[0][t * kL + j0 + j]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) a[j][c] = _mm512_fmadd_ps(pj, v[c], a[j][c]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) _mm512_store_ps(d.orow + (j0 + j) * kHd + 16 * c, a[j][c]);
  }
}

KVS_TARGET_END()

// fn runs `groups` row groups against one tile per call.
void run(benchmark::State& st, void (*fn)(Data&), int groups) {
  if (!have_avx512(st)) return;
  static Data d;
  for (auto _ : st) {
    fn(d);
    benchmark::ClobberMemory();
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * kL * kKeys * kHd * groups, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_CAPTURE(run, regs, regs, 1);
BENCHMARK_CAPTURE(run, scores, scores<false>, 1);
BENCHMARK_CAPTURE(run, scores_regk, scores<true>, 1);
BENCHMARK_CAPTURE(run, values, values, 1);
BENCHMARK_CAPTURE(run, scores4, scores4, 4);
BENCHMARK_CAPTURE(run, values4, values4, 4);
BENCHMARK_CAPTURE(run, values_rows, values_rows, 1);

}  // namespace
