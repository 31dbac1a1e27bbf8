// Where an AMX tile block goes: the parts of the Q8_0 tile kernel's inner
// loop (kernels/matmul_amx_tiles.h) timed alone and together, all in L1, on
// one thread. The unit is one block tile: 16 activation rows x 16 weight
// rows x one 32-element block (8,192 multiply-adds), as the kernel runs it.
//   dp           tdpbssd alone (zeroed C, tiles already loaded)
//   product      the kernel's product: tile loads, zero, tdpbssd, tile store
//   chain        the float chain: per row load, convert, scale, fma; alone
//                (dp_every:0), with a tdpbssd every fourth block (AMX in
//                use) or every block, and with a tile store before every
//                block to memory it does not read (store:1)
//   kernel       products one group ahead of the chain, as tile_rows runs
//   kernel_l2    the same over 32 M tiles in turn (activations from L2)
//   *_bf16       the same levels as bfloat16 on tdpbf16ps (every int8 is a
//                bf16, and every block sum is an integer below 2^24, so the
//                tile's fp32 sums are the exact ones): no conversion in the
//                chain, but each product takes a bf16 tile instruction
//                (dp_bf16: alone; product_bf16: with its loads and stores;
//                kernel_bf16: as kernel, the chain without the conversion)
//   fma_rate     independent FMAs on 512-bit (<512>) or 256-bit vectors, with
//                a tdpbssd every `dp_every` groups of sixteen (0: AMX idle):
//                float lanes per TSC tick (lanes/tsc; times BM_clock's
//                tsc/cycle at the same tile rate, lanes per core cycle)
// Counters: TSC ticks per block tile (tsc/tile) and G multiply-adds per
// second. `clock/*` times a chain of dependent integer multiplies (three
// core cycles each; adds can be folded at rename) with and without tile products in between: the core clock while
// AMX runs. docs/PERFORMANCE.md reads these as the ceiling of an exact
// (VNNI-identical) tile kernel on the machine.
// Run: build/bench_amx_anatomy
#include <benchmark/benchmark.h>
#include <x86intrin.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/matmul_amx_tiles.h"

namespace {

using namespace kvs::mm;
using namespace kvs::mm::amx_detail;

constexpr int kBlocks = KB;  // one K slice, as the kernel's scratch holds
constexpr double kMacs = 16.0 * 16.0 * 32.0;

// The scratch slice and activation tiles the kernel would see.
struct Data {
  std::vector<uint8_t> raw = std::vector<uint8_t>(KB / 2 * kPairBytes + 64);
  uint8_t* slice;
  alignas(64) XTile x[kBlocks];
  alignas(64) int32_t cbuf[4 * 256];
  // The same levels as bf16 (exact: every int8 is a bf16): per block an A
  // tile [16, 32] and a B tile [16, 64 bytes] in dword pairs.
  alignas(64) uint16_t xa[kBlocks][16 * 32];
  alignas(64) uint16_t wb[kBlocks][16 * 32];  // [16, 16 x 2]
  Data() {
    slice = raw.data() + (64 - reinterpret_cast<uintptr_t>(raw.data()) % 64) % 64;
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> lv(-127, 127);
    std::uniform_real_distribution<float> sc(0.001f, 0.01f);
    for (int b = 0; b < kBlocks; ++b) {
      uint8_t* l = lev(slice, b);
      for (int i = 0; i < 512; ++i) l[i] = uint8_t(lv(rng));
      float* s = scl(slice, b);
      for (int i = 0; i < 48; ++i) s[i] = sc(rng);
      for (int m = 0; m < 16; ++m) {
        for (int k = 0; k < 32; ++k) x[b].q[m][k] = int8_t(lv(rng));
        x[b].d[m] = sc(rng);
        x[b].s[m] = 0.0f;
      }
    }
    for (int i = 0; i < 4 * 256; ++i) cbuf[i] = lv(rng);
    auto bf = [](int v) {
      const float f = float(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return uint16_t(u >> 16);
    };
    // B of tdpbf16ps: row j, column r = elements 2j, 2j + 1 of weight row r
    // (the int8 B holds element e of row r at (e / 4) * 64 + 4 r + e % 4).
    for (int b = 0; b < kBlocks; ++b)
      for (int i = 0; i < 512; ++i) {
        xa[b][i] = bf(x[b].q[i / 32][i % 32]);
        const int j = i / 32, r = i % 32 / 2, e = 2 * j + i % 2;
        wb[b][i] = bf(int8_t(lev(slice, b)[e / 4 * 64 + 4 * r + e % 4]));
      }
  }
};

bool have_amx(benchmark::State& state) {
  if (kvs::active_isa() == kvs::Isa::Amx) return true;
  state.SkipWithError("no AMX here (or KVS_ISA lowered it, or the kernel refused the tile permission)");
  return false;
}

void report(benchmark::State& state, uint64_t ticks, int64_t tiles) {
  state.counters["tsc/tile"] = double(ticks) / double(tiles);
  state.counters["GMAC/s"] = benchmark::Counter(kMacs * double(tiles) / 1e9, benchmark::Counter::kIsRate);
}

// The target of matmul_amx_tiles.h, so its chain inlines this file's
// scale loads; the bf16 product is written as asm (KVS_DPBF16).
KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2,popcnt,amx-tile,amx-int8")
#define KVS_DPBF16(C, A, B) __asm__ volatile("tdpbf16ps %%tmm" #B ", %%tmm" #A ", %%tmm" #C ::)

// The scratch copy as the kernel reads it (matmul_amx.cpp's SliceSrc).
// (Inlined: a call would spill every live vector register, the
// accumulators included, which the kernel's loop never does.)
#define KVS_INL inline __attribute__((always_inline))
struct Src {
  static constexpr bool kU8 = false;
  const uint8_t* s;
  KVS_INL __m512 ws0(int64_t bb) const { return _mm512_load_ps(scl(s, bb)); }
  KVS_INL __m512 ws1(int64_t bb) const { return _mm512_load_ps(scl(s, bb) + 16); }
  KVS_INL __m512 wm(int64_t bb) const { return _mm512_load_ps(scl(s, bb) + 32); }
};

// The accumulators live in `out` ([16, 16]) between passes, so nothing
// outside this region holds a vector; within a pass, in registers (a local
// array, as in the kernel: an object's array stayed in memory).
KVS_INL void load_out(__m512* acc, const float* out) {
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) acc[m] = _mm512_loadu_ps(out + 16 * m);
}
KVS_INL void store_out(const __m512* acc, float* out) {
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}

// BF16: the same levels as bfloat16 on tdpbf16ps (below), else tdpbssd.
#define KVS_DP(C, A, B)      \
  if constexpr (BF16) {      \
    KVS_DPBF16(C, A, B);     \
  } else {                   \
    _tile_dpbssd(C, A, B);   \
  }
template <bool BF16>
__attribute__((noinline)) void dp_pass(Data& d) {
  if constexpr (BF16) {
    KVS_TILE_LOAD(4, d.xa[0], 64, 1024);
    KVS_TILE_LOAD(6, d.wb[0], 64, 1024);
    KVS_TILE_LOAD(5, d.xa[1], 64, 1024);
    KVS_TILE_LOAD(7, d.wb[1], 64, 1024);
  } else {
    KVS_TILE_LOAD(4, d.x[0].q, 32, 512);
    KVS_TILE_LOAD(6, lev(d.slice, 0), 64, 512);
    KVS_TILE_LOAD(5, d.x[1].q, 32, 512);
    KVS_TILE_LOAD(7, lev(d.slice, 1), 64, 512);
  }
  for (int b = 0; b < kBlocks; b += 2) {
    _tile_zero(0);
    KVS_DP(0, 4, 6);
    _tile_zero(1);
    KVS_DP(1, 5, 7);
  }
  KVS_TILE_STORE(0, d.cbuf);
}
#undef KVS_DP

// every: a tdpbssd before every `every`-th block (0: none; else a power of
// two); store: a tile
// store before every block, to memory the chain does not read.
__attribute__((noinline)) void chain_pass(Data& d, int every, bool store, float* out) {
  __m512 acc[16];
  load_out(acc, out);
  const Src src{d.slice};
  for (int b = 0; b < kBlocks; ++b) {
    if (every && (b & (every - 1)) == 0) _tile_dpbssd(0, 4, 6);  // (every: a power of two)
    if (store) KVS_TILE_STORE(1, d.cbuf + 512);
    chain<true>(d.cbuf + 256 * (b & 1), src, b, d.x[b], 16, acc);
  }
  store_out(acc, out);
}

// The bf16 variant: tdpbf16ps on the same levels gives each block sum as
// an exact float, so the chain skips the conversion.
inline void chain_f(const float* c, const Src& src, int64_t bb, const XTile& x, __m512* acc) {
  const __m512 ws0 = src.ws0(bb);
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m)
    acc[m] = _mm512_fmadd_ps(_mm512_load_ps(c + 16 * m), _mm512_mul_ps(ws0, _mm512_set1_ps(x.d[m])), acc[m]);
}
inline void products_bf16(Data& d, int b, int32_t* out) {
  KVS_TILE_LOAD(4, d.xa[b], 64, 1024);
  KVS_TILE_LOAD(6, d.wb[b], 64, 1024);
  KVS_TILE_LOAD(5, d.xa[b + 1], 64, 1024);
  KVS_TILE_LOAD(7, d.wb[b + 1], 64, 1024);
  _tile_zero(0);
  KVS_DPBF16(0, 4, 6);
  _tile_zero(1);
  KVS_DPBF16(1, 5, 7);
  KVS_TILE_STORE(0, out);
  KVS_TILE_STORE(1, out + 256);
}

// tile_rows<false, false, true, 2> over one slice: products of a group of
// two blocks issued before the chain of the group before.
// x: the M tile's activation tiles (d.x, or one of many further out; BF16:
// d.x, whose levels xa holds).
template <bool BF16>
inline void group_products(Data& d, const XTile* x, int b, int set, int32_t* out) {
  if constexpr (BF16) products_bf16(d, b, out);
  else products(set, x + b, lev(d.slice, b), lev(d.slice, b + 1), 2, out);
}
template <bool BF16>
inline void block_chain(const int32_t* c, const Src& src, int b, const XTile& x, __m512* acc) {
  if constexpr (BF16) chain_f(reinterpret_cast<const float*>(c), src, b, x, acc);
  else chain<true>(c, src, b, x, 16, acc);
}
template <bool BF16>
__attribute__((noinline)) void kernel_pass(Data& d, const XTile* x, float* out) {
  __m512 acc[16];
  load_out(acc, out);
  const Src src{d.slice};
  int32_t* ring[2] = {d.cbuf, d.cbuf + 512};
  group_products<BF16>(d, x, 0, 0, ring[0]);
  for (int g = 0; g < kBlocks; g += 2) {
    const int k = (g / 2) & 1;
    if (g + 2 < kBlocks) group_products<BF16>(d, x, g + 2, k ^ 1, ring[k ^ 1]);
    block_chain<BF16>(ring[k], src, g, x[g], acc);
    block_chain<BF16>(ring[k] + 256, src, g + 1, x[g + 1], acc);
  }
  store_out(acc, out);
}

template <bool BF16>
__attribute__((noinline)) void product_pass(Data& d) {
  for (int b = 0; b < kBlocks; b += 2) group_products<BF16>(d, d.x, b, 0, d.cbuf);
}

__attribute__((noinline)) uint64_t mul_chain(int64_t n, int dp_every, uint64_t v) {
  for (int64_t i = 0; i < n; ++i) {
    if (dp_every && i % dp_every == 0) _tile_dpbssd(0, 4, 6);
#pragma GCC unroll 16
    for (int k = 0; k < 64; ++k) __asm__ volatile("imul %0, %0" : "+r"(v));
  }
  return v;
}

// Sixteen independent FMA chains per group, n groups, a tile product
// before every dp_every-th group (0: none).
template <int W>
__attribute__((noinline)) float fma_groups(int64_t n, int dp_every, float fa, float fb) {
  const __m512 a = _mm512_set1_ps(fa), b = _mm512_set1_ps(fb);
  __m512 z[16];
  __m256 h[16];
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) z[k] = _mm512_set1_ps(1.0f + float(k)), h[k] = _mm512_castps512_ps256(z[k]);
  const __m256 a2 = _mm512_castps512_ps256(a), b2 = _mm512_castps512_ps256(b);
  for (int64_t i = 0; i < n; ++i) {
    if (dp_every && i % dp_every == 0) _tile_dpbssd(0, 4, 6);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) {
      if constexpr (W == 512) z[k] = _mm512_fmadd_ps(z[k], a, b);
      else h[k] = _mm256_fmadd_ps(h[k], a2, b2);
    }
  }
  __m512 s = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) s = _mm512_add_ps(s, W == 512 ? z[k] : _mm512_castps256_ps512(h[k]));
  return _mm512_reduce_add_ps(s);
}

KVS_TARGET_END()

// Whether tdpbf16ps gives the first two blocks' sums exactly as tdpbssd does.
bool bf16_sums_exact(Data& d) {
  alignas(64) int32_t isum[512];
  alignas(64) float fsum[512];
  {
    TileScope scope(TileMode::K32);
    products(0, d.x, lev(d.slice, 0), lev(d.slice, 1), 2, isum);
  }
  TileScope scope(TileMode::Bf16);
  products_bf16(d, 0, reinterpret_cast<int32_t*>(fsum));
  for (int i = 0; i < 512; ++i)
    if (fsum[i] != float(isum[i])) return false;
  return true;
}

// Times pass over the kernel's data, BF16: with the bf16 levels (after
// checking that their sums are the int8 ones).
template <bool BF16 = false, class F>
void run(benchmark::State& state, F pass) {
  if (!have_amx(state)) return;
  Data d;
  if (BF16 && !bf16_sums_exact(d)) {
    state.SkipWithError("the bf16 tile sums differ from the int8 ones");
    return;
  }
  TileScope scope(BF16 ? TileMode::Bf16 : TileMode::K32);
  if constexpr (BF16) {
    KVS_TILE_LOAD(4, d.xa[0], 64, 1024);
    KVS_TILE_LOAD(6, d.wb[0], 64, 1024);
  } else {
    KVS_TILE_LOAD(4, d.x[0].q, 32, 512);
    KVS_TILE_LOAD(6, lev(d.slice, 0), 64, 512);
  }
  int64_t tiles = 0;
  const uint64_t t0 = __rdtsc();
  for (auto _ : state) {
    pass(d);
    tiles += kBlocks;
  }
  report(state, __rdtsc() - t0, tiles);
}

void BM_dp(benchmark::State& state) { run(state, [](Data& d) { dp_pass<false>(d); }); }
void BM_product(benchmark::State& state) { run(state, [](Data& d) { product_pass<false>(d); }); }
// Args: a tdpbssd every `every` blocks (0: none), a tile store per block (1).
void BM_chain(benchmark::State& state) {
  std::vector<float> acc(256, 0.0f);
  const int every = int(state.range(0));
  const bool store = state.range(1) != 0;
  run(state, [&](Data& d) { chain_pass(d, every, store, acc.data()); });
  benchmark::DoNotOptimize(acc.data());
}
void BM_kernel(benchmark::State& state) {
  std::vector<float> acc(256, 0.0f);
  run(state, [&](Data& d) { kernel_pass<false>(d, d.x, acc.data()); });
  benchmark::DoNotOptimize(acc.data());
}
void BM_dp_bf16(benchmark::State& state) { run<true>(state, [](Data& d) { dp_pass<true>(d); }); }
void BM_product_bf16(benchmark::State& state) { run<true>(state, [](Data& d) { product_pass<true>(d); }); }
void BM_kernel_bf16(benchmark::State& state) {
  std::vector<float> acc(256, 0.0f);
  run<true>(state, [&](Data& d) { kernel_pass<true>(d, d.x, acc.data()); });
  benchmark::DoNotOptimize(acc.data());
}
// The same against 32 M tiles in turn, whose activation tiles (as a
// 512-row prefill chunk's) are in L2, not L1: the slice stays in L1.
void BM_kernel_l2(benchmark::State& state) {
  std::vector<float> acc(256, 0.0f);
  std::vector<XTile> many;
  int64_t t = 0;
  run(state, [&](Data& d) {
    if (many.empty())
      for (int i = 0; i < 32; ++i) many.insert(many.end(), d.x, d.x + kBlocks);
    kernel_pass<false>(d, many.data() + (t++ % 32) * kBlocks, acc.data());
  });
  benchmark::DoNotOptimize(acc.data());
}

// Runs body once per iteration with tiles 4 and 6 loaded (the operands of
// the tile products the loops below issue); the TSC ticks it took.
template <class F>
uint64_t with_tiles(benchmark::State& state, F body) {
  Data d;
  TileScope scope(TileMode::K32);
  KVS_TILE_LOAD(4, d.x[0].q, 32, 512);
  KVS_TILE_LOAD(6, lev(d.slice, 0), 64, 512);
  const uint64_t t0 = __rdtsc();
  for (auto _ : state) body();
  return __rdtsc() - t0;
}

// Core clock from a dependent multiply chain (three cycles each), with a
// tile product every `every` groups of 64 (0: none, AMX idle).
void BM_clock(benchmark::State& state) {
  if (!have_amx(state)) return;
  const int every = int(state.range(0));
  constexpr int64_t kGroups = 4096;
  uint64_t v = 3;
  int64_t muls = 0;
  const uint64_t ticks = with_tiles(state, [&] {
    v = mul_chain(kGroups, every, v);
    muls += 64 * kGroups;
  });
  state.counters["tsc/cycle"] = double(ticks) / double(3 * muls);
  state.counters["core_GHz"] = benchmark::Counter(3.0 * double(muls) / 1e9, benchmark::Counter::kIsRate);
  benchmark::DoNotOptimize(v);
}

// FMA lanes per TSC tick with the tile unit idle or in use (per core
// cycle: times BM_clock's tsc/cycle at the same dp_every).
template <int W>
void BM_fma_rate(benchmark::State& state) {
  if (!have_amx(state)) return;
  const int every = int(state.range(0));
  constexpr int64_t kGroups = 1 << 16;
  float acc = 0.0f;
  int64_t groups = 0;
  const uint64_t ticks = with_tiles(state, [&] {
    acc += fma_groups<W>(kGroups, every, 0.999f, 1e-4f);
    groups += kGroups;
  });
  state.counters["tsc/fma"] = double(ticks) / double(16 * groups);
  state.counters["lanes/tsc"] = double(16 * groups) * (W / 32) / double(ticks);
  benchmark::DoNotOptimize(acc);
}

BENCHMARK(BM_dp);
BENCHMARK(BM_product);
BENCHMARK(BM_chain)->ArgNames({"dp_every", "store"})->Args({0, 0})->Args({4, 0})->Args({1, 0})->Args({4, 1});
BENCHMARK(BM_kernel);
BENCHMARK(BM_kernel_l2);
BENCHMARK(BM_dp_bf16);
BENCHMARK(BM_product_bf16);
BENCHMARK(BM_kernel_bf16);
BENCHMARK(BM_clock)->Arg(0)->Arg(1)->Arg(16);
BENCHMARK(BM_fma_rate<512>)->ArgName("dp_every")->Arg(0)->Arg(4)->Arg(64);
BENCHMARK(BM_fma_rate<256>)->ArgName("dp_every")->Arg(0)->Arg(4)->Arg(64);

}  // namespace
