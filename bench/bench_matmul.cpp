// matmul micro-benchmarks at the 1.1B Llama shapes (dim 2048, ffn 8192,
// vocab 32000).
//   n = 1   decode matvec: memory bound -> counter GB/s of weight bytes. The
//           weights are cycled through enough copies (>= 640 MB, over twice
//           the L3) that every call streams from DRAM, like a real decode.
//   n1hot   the same with one copy: kernel speed when the weights are cached.
//   n = 16  batched decode / n = 128 prefill: compute bound -> GFLOP/s
//           (2 * rows * cols * n per call), one weight copy.
//   n16cold n = 16 with the weights cycled through DRAM like n = 1: batched
//           decode of a model larger than the caches.
// On a shared machine wall time includes waiting for a core; for t1 runs the
// *_cpu counters divide by the calling thread's CPU time instead (the kernel
// speed when it has a core; DRAM contention from other processes remains).
// Run: build-kern/bench_matmul --benchmark_filter='Q4_0/2048x2048' (MXFP4/... beside it)
// ISA: KVS_ISA=scalar|avx2|avx512 (default: best available).
// Quantized weights run on Panel16 copies (Panel8 under AVX2; load-time repack, as Model::load does)
// unless KVS_REPACK=0: run both to compare file layout and packed layout.
// Decode variant (kernels/decode_variant.h) for every type:
// KVS_DECODE_VARIANT=PANELS,PREFETCH, e.g. 4,1024 (default: the built-in one).
// amx_vs_vnni/...: on a CPU with AMX, the AMX tile kernels and the AVX-512
// VNNI ones on the same Panel16 weights, alternating call by call in one run;
// counters GFLOP/s_amx, GFLOP/s_vnni and their ratio amx/vnni.
// Run: bench_matmul --benchmark_filter='amx_vs_vnni
// bf16_cold/...: the AmxBf16 copy at n = 16 .. 192 rows, one copy or cycled
// through DRAM (ncoldN): a mixed step of decode and prompt rows.
// bf16_vs_fp32/...: on a CPU with AMX-BF16, float weights as the AmxBf16 copy
// (--prefill-precision bf16) and as the Panel16 copy (fp32, the default),
// alternating call by call; counters GFLOP/s_bf16, GFLOP/s_fp32, bf16/fp32.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <ctime>
#include <vector>

#include "kernels/amx_rows.h"
#include "kernels/cpu.h"
#include "kernels/decode_variant.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/threadpool.h"
#include "kernels/weight_pack.h"

namespace {

using kvs::GgmlType;

struct Shape {
  int64_t rows, cols;
  const char* what;
};
// Outputs at the engine's row stride (kvs::padded_ld): rows a power of two
// apart would alias in the caches, and the AMX GEMM would split such a
// prompt into more chunks than the engine ever runs.
int64_t out_ld(int64_t rows) { return kvs::padded_ld(rows); }
const Shape kShapes[] = {{2048, 2048, "wq"}, {8192, 2048, "w_up"}, {2048, 8192, "w_down"},
                         {32000, 2048, "output"}};
const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::MXFP4, GgmlType::Q8_0, GgmlType::F16,
                           GgmlType::F32,  GgmlType::BF16,  GgmlType::Q4_1, GgmlType::Q5_0,
                           GgmlType::Q5_1, GgmlType::Q4_K,  GgmlType::Q5_K, GgmlType::Q6_K};

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

struct Copies {
  std::unique_ptr<uint8_t[], decltype(&std::free)> mem{nullptr, &std::free};
  size_t matrix_bytes = 0;
  int count = 0;
};

Copies make_weights(GgmlType t, const Shape& s, bool cold) {
  const size_t rb = kvs::row_bytes(t, s.cols);
  Copies c;
  c.matrix_bytes = rb * size_t(s.rows);
  c.count = cold ? int(std::max<size_t>(1, (size_t(640) << 20) / c.matrix_bytes + 1)) : 1;
  const size_t total = c.matrix_bytes * size_t(c.count);
  c.mem.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (total + 63) / 64 * 64)));
  // Quantize 64 distinct rows once, tile them over the matrix (the values do
  // not change the speed; quantizing 640 MB with the reference would).
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> src(size_t(s.cols));  // [cols]
  std::vector<uint8_t> rows(rb * 64);      // [64, rb]
  for (int r = 0; r < 64; ++r) {
    for (auto& v : src) v = nd(rng);
    kvs::quantize_row(t, src.data(), rows.data() + rb * size_t(r), s.cols);
  }
  for (size_t r = 0; r < size_t(s.rows) * size_t(c.count); ++r)
    std::memcpy(c.mem.get() + r * rb, rows.data() + (r % 64) * rb, rb);
  return c;
}

// precision Bf16: float weights as the AmxBf16 copy (--prefill-precision bf16).
void BM_matmul(benchmark::State& state, GgmlType t, Shape s, int64_t n, int threads, bool cold,
               kvs::MatmulPrecision precision) {
  const bool bf16 = precision == kvs::MatmulPrecision::Bf16;
  if (bf16 && !kvs::amx_bf16_active()) {
    state.SkipWithError("no AMX-BF16 here (CPU, OS, permission or KVS_ISA)");
    return;
  }
  Copies c = make_weights(t, s, cold);
  kvs::ThreadPool pool(threads);
  // [n, cols], [n, rows] at the engine's padded output stride
  std::vector<float> x(size_t(n * s.cols)), y(size_t(n * out_ld(s.rows)));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  kvs::WeightView w;
  w.type = t;
  w.rows = s.rows;
  w.cols = s.cols;
  w.row_stride = kvs::row_bytes(t, s.cols);
  // Packed copies (Panel16, or AmxBf16), one per weight copy, exactly as Model::load makes them.
  std::vector<kvs::PackedArena> arenas;
  std::vector<const uint8_t*> packed;
  const char* rp = std::getenv("KVS_REPACK");
  if (bf16 || (!(rp && std::string(rp) == "0") && kvs::packable(w))) {
    for (int i = 0; i < c.count; ++i) {
      kvs::WeightView wi = w;
      wi.data = c.mem.get() + c.matrix_bytes * size_t(i);
      arenas.push_back(kvs::pack_weights({{&wi, false}}, nullptr, precision));
      packed.push_back(wi.packed);
      w.pack = wi.pack;
    }
  }
  int idx = 0;
  const double cpu0 = thread_cpu_seconds();
  for (auto _ : state) {
    w.data = c.mem.get() + c.matrix_bytes * size_t(idx);
    if (!packed.empty()) w.packed = packed[size_t(idx)];
    idx = idx + 1 == c.count ? 0 : idx + 1;
    kvs::matmul(w, x.data(), s.cols, n, y.data(), out_ld(s.rows), pool);
    benchmark::DoNotOptimize(y.data());
  }
  const double cpu = thread_cpu_seconds() - cpu0;
  const double iters = double(state.iterations());
  const double flops = 2.0 * double(s.rows) * double(s.cols) * double(n) * iters;
  if (threads == 1 && cpu > 0) {
    if (n == 1) state.counters["GB/s_cpu"] = double(c.matrix_bytes) * iters / cpu / 1e9;
    state.counters["GFLOP/s_cpu"] = flops / cpu / 1e9;
  }
  if (n == 1) {  // n1: weights cycled through DRAM; n1hot: one copy, cache-resident if it fits
    state.counters["GB/s"] = benchmark::Counter(double(c.matrix_bytes) * iters / 1e9,
                                                benchmark::Counter::kIsRate);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  const std::string path = bf16                         ? " amx bf16"
                           : kvs::amx_tiles_run(w, n) ? " amx tiles"
                           : packed.empty()           ? ""
                                                      : " panel16";
  state.SetLabel(kvs::isa_name(kvs::active_isa()) + " " + s.what + path);
}

// Two ways of one product, one call of each per iteration, each timed on
// its own: way k runs w[k] after setup(k). Counters GFLOP/s_<a>,
// GFLOP/s_<b> and <a>/<b> (the speed-up of a).
template <class Setup>
void alternate(benchmark::State& state, const kvs::WeightView (&w)[2], Setup setup, const Shape& s, int64_t n,
               int threads, const char* a, const char* b) {
  kvs::ThreadPool pool(threads);
  // [n, cols], [n, rows] at the engine's padded output stride
  std::vector<float> x(size_t(n * s.cols)), y(size_t(n * out_ld(s.rows)));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  double sec[2] = {0, 0};
  for (auto _ : state) {
    for (int k = 0; k < 2; ++k) {
      setup(k);
      const auto t0 = std::chrono::steady_clock::now();
      kvs::matmul(w[k], x.data(), s.cols, n, y.data(), out_ld(s.rows), pool);
      sec[k] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      benchmark::DoNotOptimize(y.data());
    }
  }
  const double gflop = 2.0 * double(s.rows) * double(s.cols) * double(n) * double(state.iterations()) / 1e9;
  state.counters[std::string("GFLOP/s_") + a] = gflop / sec[0];
  state.counters[std::string("GFLOP/s_") + b] = gflop / sec[1];
  state.counters[std::string(a) + "/" + b] = sec[1] / sec[0];
}

// A load-time copy of `file` in layout l, into arena.
kvs::WeightView packed_view(const kvs::WeightView& file, kvs::PackLayout l, kvs::PackedArena& arena) {
  arena = kvs::PackedArena(kvs::packed_size(file, l));
  kvs::pack_panels_into(file, l, arena.data());
  kvs::WeightView w = file;
  w.packed = arena.data();
  w.pack = l;
  return w;
}

// Both paths on one weight copy (its Panel16 copy), tiles forced from n = 1
// for the run.
void BM_amx_vs_vnni(benchmark::State& state, GgmlType t, Shape s, int64_t n, int threads) {
  kvs::set_isa_override(kvs::Isa::Amx);
  const bool amx = kvs::active_isa() == kvs::Isa::Amx;
  kvs::clear_isa_override();
  if (!amx) {
    state.SkipWithError("no AMX here (CPU, OS or permission)");
    return;
  }
  Copies c = make_weights(t, s, false);
  kvs::PackedArena arena;
  const kvs::WeightView p = packed_view({t, c.mem.get(), s.rows, s.cols, kvs::row_bytes(t, s.cols)},
                                        kvs::PackLayout::Panel16, arena);
  const kvs::WeightView w[2] = {p, p};
  kvs::set_amx_min_rows(t, 1);
  alternate(state, w, [](int k) { kvs::set_isa_override(k == 0 ? kvs::Isa::Amx : kvs::Isa::Avx512); }, s, n,
            threads, "amx", "vnni");
  kvs::clear_isa_override();
  kvs::reset_amx_min_rows();
  state.SetLabel(std::string(s.what) + " panel16");
}

// A float matrix's two copies: AmxBf16 (--prefill-precision bf16) and Panel16.
void BM_bf16_vs_fp32(benchmark::State& state, GgmlType t, Shape s, int64_t n, int threads) {
  if (!kvs::amx_bf16_active()) {
    state.SkipWithError("no AMX-BF16 here (CPU, OS, permission or KVS_ISA)");
    return;
  }
  Copies c = make_weights(t, s, false);
  const kvs::WeightView file{t, c.mem.get(), s.rows, s.cols, kvs::row_bytes(t, s.cols)};
  kvs::PackedArena arenas[2];
  const kvs::WeightView w[2] = {packed_view(file, kvs::PackLayout::AmxBf16, arenas[0]),
                                packed_view(file, kvs::PackLayout::Panel16, arenas[1])};
  alternate(state, w, [](int) {}, s, n, threads, "bf16", "fp32");
  state.SetLabel(s.what);
}

// KVS_DECODE_VARIANT=PANELS,PREFETCH for every type; exits on a bad value.
void apply_variant_from_env() {
  const char* e = std::getenv("KVS_DECODE_VARIANT");
  if (!e || !*e) return;
  kvs::DecodeVariant v;
  if (std::sscanf(e, "%d,%d", &v.panels, &v.prefetch) != 2 || !kvs::is_decode_variant(v)) {
    std::fprintf(stderr, "KVS_DECODE_VARIANT=%s: want PANELS,PREFETCH among the candidates (e.g. 4,1024)\n", e);
    std::exit(2);
  }
  for (GgmlType t : kTypes) kvs::set_decode_variant(t, v);
}

// prefix/TYPE/ROWSxCOLS/nN/tT for every type, shape, n and 1 or 2 threads.
void register_pairs(const std::string& prefix, void (*bm)(benchmark::State&, GgmlType, Shape, int64_t, int),
                    std::initializer_list<GgmlType> types, std::initializer_list<int64_t> ns) {
  for (GgmlType t : types)
    for (const Shape& s : kShapes)
      for (int64_t n : ns)
        for (int threads : {1, 2}) {
          const std::string name = prefix + "/" + kvs::type_name(t) + "/" + std::to_string(s.rows) + "x" +
                                   std::to_string(s.cols) + "/n" + std::to_string(n) + "/t" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), bm, t, s, n, threads)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond)
              ->MinTime(0.5);
        }
}

int register_all() {
  apply_variant_from_env();
  for (GgmlType t : kTypes)
    for (const Shape& s : kShapes)
      // 0: n = 1, cache-hot; -16: n = 16 with the weights cycled through DRAM
      // (batched decode of a model larger than the caches).
      for (int64_t n : {int64_t(0), int64_t(1), int64_t(16), int64_t(-16), int64_t(128), int64_t(512)})
        for (int threads : {1, 2}) {
          const bool cold = n == 1 || n < 0;
          const std::string tag = n == 0 ? "1hot" : n < 0 ? std::to_string(-n) + "cold" : std::to_string(n);
          const std::string name = kvs::type_name(t) + "/" + std::to_string(s.rows) + "x" +
                                   std::to_string(s.cols) + "/n" + tag + "/t" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), BM_matmul, t, s, n == 0 ? 1 : n < 0 ? -n : n, threads, cold,
                                       kvs::MatmulPrecision::Fp32)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond)
              ->MinTime(n == 1 ? 0.3 : 0.5);
        }
  register_pairs("amx_vs_vnni", BM_amx_vs_vnni,
                 {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::MXFP4, GgmlType::Q4_K, GgmlType::Q6_K}, {4, 8, 16, 128, 512});
  register_pairs("bf16_vs_fp32", BM_bf16_vs_fp32, {GgmlType::F16, GgmlType::BF16, GgmlType::F32}, {1, 16, 128, 512});
  for (const Shape& s : kShapes)
    for (int64_t n : {16, 48, 96, 192})
      for (const bool cold : {false, true}) {
        const std::string name = "bf16_cold/F16/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) + "/n" +
                                 (cold ? "cold" : "") + std::to_string(n) + "/t2";
        benchmark::RegisterBenchmark(name.c_str(), BM_matmul, GgmlType::F16, s, n, 2, cold, kvs::MatmulPrecision::Bf16)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.5);
      }
  return 0;
}
const int registered = register_all();

}  // namespace
