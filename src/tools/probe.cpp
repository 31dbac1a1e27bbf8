// Machine probe. Bandwidth: every thread streams its own slice of a buffer
// much larger than the last-level cache (first touched by that same thread so
// pages land on its NUMA node) and XOR-folds it so no load can be elided;
// best of several passes. Peak rate: each thread runs a loop of independent
// accumulator chains (enough to cover the instruction's latency on both FMA
// ports) on the widest instruction the CPU has, compiled per function with a
// target attribute and chosen at run time, so the binary stays baseline x86-64.
#include "tools/probe.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <thread>

#include "kernels/cpu.h"
#include "kernels/huge_pages.h"
#include "kernels/matmul.h"
#include "kernels/weight_pack.h"
#include "kernels/quant.h"
#include "kernels/threadpool.h"
#include "tools/units.h"

namespace kvs::tools {
namespace {

using Clock = std::chrono::steady_clock;
std::atomic<uint64_t> g_sink{0};  // results land here so no kernel is dead code

uint64_t bits(double v) {  // a kernel's result folded into the sink, whatever its sign
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Runs body(tid) on `threads` threads released together; returns wall seconds
// from the release to the last thread finishing.
template <class F>
double timed_parallel(int threads, F&& body) {
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      body(t);
    });
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- streaming read kernels: n is a multiple of 256 --------------------------

__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  alignas(64) uint64_t out[8];
  _mm512_store_si512(out, _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)));
  return out[0] ^ out[3] ^ out[7];
}

__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)));
  return out[0] ^ out[3];
}

uint64_t read_scalar(const uint8_t* p, size_t n) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a[8] = {};
  for (size_t i = 0; i < n / 8; i += 8)
    for (int k = 0; k < 8; ++k) a[k] ^= q[i + k];
  return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

uint64_t read_best(const uint8_t* p, size_t n) {
  const Isa isa = active_isa();
  if (isa >= Isa::Avx512) return read_avx512(p, n);
  if (isa >= Isa::Avx2) return read_avx2(p, n);
  return read_scalar(p, n);
}

// ---- peak-rate kernels: return a value derived from every accumulator -------
// Twelve independent chains: FMA latency 4 × 2 ports = 8 in flight minimum,
// with margin for dot-product instructions of latency 5-6.
#define KVS_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

// Horizontal sums via a store: GCC 12's _mm512_reduce_* trip -Wuninitialized
// inside its own headers.
__attribute__((target("avx512f"))) double hsum512(__m512 v) {
  alignas(64) float o[16];
  _mm512_store_ps(o, v);
  double s = 0;
  for (float x : o) s += x;
  return s;
}

__attribute__((target("avx512f"))) double hsum512i(__m512i v) {
  alignas(64) int32_t o[16];
  _mm512_store_si512(o, v);
  double s = 0;
  for (int32_t x : o) s += x;
  return s;
}

__attribute__((target("avx512f"))) double fp32_avx512(int64_t iters) {
  const __m512 m = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
#define D(i) __m512 a##i = _mm512_set1_ps(0.5f + i);
  KVS_REP12(D)
#undef D
  for (int64_t it = 0; it < iters; ++it) {
#define F(i) a##i = _mm512_fmadd_ps(a##i, m, c);
    KVS_REP12(F)
#undef F
  }
  __m512 s = _mm512_setzero_ps();
#define S(i) s = _mm512_add_ps(s, a##i);
  KVS_REP12(S)
#undef S
  return hsum512(s);
}

__attribute__((target("avx2,fma"))) double fp32_avx2(int64_t iters) {
  const __m256 m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
#define D(i) __m256 a##i = _mm256_set1_ps(0.5f + i);
  KVS_REP12(D)
#undef D
  for (int64_t it = 0; it < iters; ++it) {
#define F(i) a##i = _mm256_fmadd_ps(a##i, m, c);
    KVS_REP12(F)
#undef F
  }
  __m256 s = _mm256_setzero_ps();
#define S(i) s = _mm256_add_ps(s, a##i);
  KVS_REP12(S)
#undef S
  alignas(32) float o[8];
  _mm256_store_ps(o, s);
  return o[0] + o[7];
}

double fp32_scalar(int64_t iters) {
  float a[8] = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f};
  const float m = 0.9999f, c = 1e-4f;
  for (int64_t it = 0; it < iters; ++it)
    for (int k = 0; k < 8; ++k) a[k] = a[k] * m + c;
  return a[0] + a[7];
}

__attribute__((target("avx512f,avx512bf16"))) double bf16_avx512(int64_t iters) {
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
  const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(3e-3f), _mm512_set1_ps(1e-3f));
#define D(i) __m512 a##i = _mm512_set1_ps(float(i));
  KVS_REP12(D)
#undef D
  for (int64_t it = 0; it < iters; ++it) {
#define F(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    KVS_REP12(F)
#undef F
  }
  __m512 s = _mm512_setzero_ps();
#define S(i) s = _mm512_add_ps(s, a##i);
  KVS_REP12(S)
#undef S
  return hsum512(s);
}

__attribute__((target("avx512f,avx512vnni"))) double int8_avx512vnni(int64_t iters) {
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-2);
#define D(i) __m512i a##i = _mm512_set1_epi32(i);
  KVS_REP12(D)
#undef D
  for (int64_t it = 0; it < iters; ++it) {
#define F(i) a##i = _mm512_dpbusd_epi32(a##i, x, y);
    KVS_REP12(F)
#undef F
  }
  __m512i s = _mm512_setzero_si512();
#define S(i) s = _mm512_add_epi32(s, a##i);
  KVS_REP12(S)
#undef S
  return hsum512i(s);
}

__attribute__((target("avx2,avxvnni"))) double int8_avxvnni(int64_t iters) {
  const __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-2);
#define D(i) __m256i a##i = _mm256_set1_epi32(i);
  KVS_REP12(D)
#undef D
  for (int64_t it = 0; it < iters; ++it) {
#define F(i) a##i = _mm256_dpbusd_avx_epi32(a##i, x, y);
    KVS_REP12(F)
#undef F
  }
  __m256i s = _mm256_setzero_si256();
#define S(i) s = _mm256_add_epi32(s, a##i);
  KVS_REP12(S)
#undef S
  return double(_mm256_extract_epi32(s, 0));
}

// Pre-VNNI AVX2 int8 dot: maddubs (u8×s8 -> i16 pairs) then madd with ones
// (-> i32), the sequence ggml uses; the asm barrier keeps the invariant
// products inside the loop.
__attribute__((target("avx2"))) double int8_avx2(int64_t iters) {
  __m256i x = _mm256_set1_epi8(3);
  const __m256i y = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
#define D(i) __m256i a##i = _mm256_set1_epi32(i);
  KVS_REP12(D)
#undef D
  for (int64_t it = 0; it < iters; ++it) {
    __asm__("" : "+x"(x));
#define F(i) a##i = _mm256_add_epi32(a##i, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones));
    KVS_REP12(F)
#undef F
  }
  __m256i s = _mm256_setzero_si256();
#define S(i) s = _mm256_add_epi32(s, a##i);
  KVS_REP12(S)
#undef S
  return double(_mm256_extract_epi32(s, 0));
}

double int8_scalar(int64_t iters) {
  int32_t a[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  int32_t x = 3, y = -2;
  for (int64_t it = 0; it < iters; ++it) {
    __asm__("" : "+r"(x), "+r"(y));  // keeps the products from being folded away
    for (int k = 0; k < 8; ++k) a[k] += x * (y + k);
  }
  return double(a[0] + a[7]);
}

#undef KVS_REP12

struct Kernel {
  std::string isa;
  double ops_per_iter;  // arithmetic operations (multiply and add count 1 each)
  double (*fn)(int64_t);
};

Kernel pick_kernel(const std::string& path) {
  const CpuFeatures& f = cpu_features();
  const Isa isa = active_isa();
  const bool a512 = isa >= Isa::Avx512, a2 = isa >= Isa::Avx2;
  const Kernel fp32 = a512  ? Kernel{"avx512 vfmadd231ps", 12 * 16 * 2, fp32_avx512}
                      : a2 ? Kernel{"avx2 vfmadd231ps", 12 * 8 * 2, fp32_avx2}
                           : Kernel{"scalar mul+add", 8 * 2, fp32_scalar};
  if (path == "fp32") return fp32;
  if (path == "bf16") {
    // vdpbf16ps: 16 lanes × 2 bf16 products, each a multiply and an add.
    if (a512 && f.avx512bf16) return {"avx512_bf16 vdpbf16ps", 12 * 16 * 2 * 2, bf16_avx512};
    Kernel k = fp32;  // without a native dot, bf16 is widened and runs at the fp32 rate
    k.isa += " (no native bf16)";
    return k;
  }
  if (path == "int8") {
    // vpdpbusd: 16 (or 8) lanes × 4 u8·s8 products, each a multiply and an add.
    if (a512 && f.avx512vnni) return {"avx512_vnni vpdpbusd", 12 * 16 * 4 * 2, int8_avx512vnni};
    if (a2 && f.avxvnni) return {"avx_vnni vpdpbusd", 12 * 8 * 4 * 2, int8_avxvnni};
    if (a2) return {"avx2 vpmaddubsw+vpmaddwd", 12 * 32 * 2, int8_avx2};
    return {"scalar int32 mul+add", 8 * 2, int8_scalar};
  }
  if (path == "int8_amx") {
    // 4 tdpbssd of 16 x 16 outputs x 64 products, each a multiply and an add.
    if (isa == Isa::Amx) return {"amx_int8 tdpbssd", 4 * 16 * 16 * 64 * 2, amx_int8_loop};
    throw std::invalid_argument("compute path int8_amx: AMX is not in use here");
  }
  if (path == "bf16_amx") {
    // 4 tdpbf16ps of 16 x 16 outputs x 32 products, each a multiply and an add.
    if (amx_bf16_active()) return {"amx_bf16 tdpbf16ps", 4 * 16 * 16 * 32 * 2, amx_bf16_loop};
    throw std::invalid_argument("compute path bf16_amx: AMX-BF16 is not in use here");
  }
  if (path == "fp32_amx") {
    // 12 FMAs of 16 lanes per round, each a multiply and an add (the tile
    // products between them are not counted).
    if (isa == Isa::Amx) return {"avx512 vfmadd231ps beside amx tiles", 12 * 16 * 2, fp32_beside_amx_loop};
    throw std::invalid_argument("compute path fp32_amx: AMX is not in use here");
  }
  throw std::invalid_argument("unknown compute path '" + path +
                              "' (expected fp32, bf16, int8, int8_amx, bf16_amx or fp32_amx)");
}

std::vector<int> thread_counts(int max_threads) {
  std::vector<int> v;
  for (int t = 1; t < max_threads; t *= 2) v.push_back(t);
  v.push_back(max_threads);
  return v;
}

int resolve_threads(int t) {
  if (t > 0) return t;
  return std::max(1, cpu_features().logical_cores);
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

}  // namespace

std::string lower_ascii(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

GgmlType weight_type_from_name(const std::string& name) {
  const std::string l = lower_ascii(name);
  for (uint32_t raw = 0; raw < 64; ++raw) {
    if (!is_known_type(raw)) continue;
    const auto t = GgmlType(raw);
    if (lower_ascii(type_name(t)) == l) {
      if (!type_traits(t).supported) throw std::invalid_argument("kernel probe: type '" + name + "' is not supported");
      return t;
    }
  }
  throw std::invalid_argument("kernel probe: unknown weight type '" + name + "'");
}

KernelRate measure_kernel(const std::string& type, int64_t rows, int64_t cols, const std::vector<int>& ns,
                          uint64_t buffer_bytes, int threads, int runs, double seconds) {
  const GgmlType t = weight_type_from_name(type);
  threads = resolve_threads(threads);
  if (rows < 1 || cols < 1) throw std::invalid_argument("kernel probe: empty matrix");
  if (runs < 1) throw std::invalid_argument("kernel probe: runs must be >= 1");
  const size_t rb = row_bytes(t, cols);  // throws when cols is not a whole number of blocks
  const size_t stride = (rb + 63) / 64 * 64;
  const size_t mat = stride * size_t(rows);
  // One quantized matrix of deterministic pseudo-random weights, then copies.
  std::unique_ptr<uint8_t, decltype(&std::free)> one(static_cast<uint8_t*>(std::aligned_alloc(64, mat)), &std::free);
  if (!one) throw std::runtime_error("kernel probe: out of memory");
  std::memset(one.get(), 0, mat);
  uint64_t lcg = 0x9e3779b97f4a7c15ull;
  const auto rnd = [&] {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return float(int32_t(lcg >> 33) % 2001 - 1000) * 1e-3f;  // [-1, 1]
  };
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = rnd();
    quantize_row(t, row.data(), one.get() + size_t(r) * stride, cols);
  }
  const size_t copies = std::max<size_t>(2, size_t((buffer_bytes + mat - 1) / mat));
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(std::aligned_alloc(4096, (copies * mat + 4095) / 4096 * 4096)),
                                                     &std::free);
  if (!buf) throw std::runtime_error("kernel probe: cannot allocate " + format_bytes(double(copies * mat)));
  for (size_t c = 0; c < copies; ++c) std::memcpy(buf.get() + c * mat, one.get(), mat);
  one.reset();
  const int n_max = ns.empty() ? 1 : *std::max_element(ns.begin(), ns.end());
  std::vector<float> x(size_t(n_max) * size_t(cols)), y(size_t(n_max) * size_t(rows));
  for (auto& v : x) v = rnd();
  ThreadPool pool(threads);
  // The engine's view of each copy: repacked exactly as Model::load does, so
  // the rates are those of the kernels a loaded model runs.
  std::vector<WeightView> views(copies);
  for (size_t c = 0; c < copies; ++c) {
    WeightView& w = views[c];
    w.type = t;
    w.data = buf.get() + c * mat;
    w.rows = rows;
    w.cols = cols;
    w.row_stride = stride;
  }
  std::vector<PackedArena> packed;
  if (repack_enabled())
    for (WeightView& w : views) packed.push_back(pack_weights({{&w, false}}));
  size_t next = 0;
  const auto product = [&](int n) {
    const WeightView& w = views[next];
    next = (next + 1) % copies;
    matmul(w, x.data(), cols, n, y.data(), rows, pool);
  };
  KernelRate out;
  out.type = lower_ascii(type_name(t));
  std::vector<int> sorted = ns;
  std::sort(sorted.begin(), sorted.end());
  for (int n : sorted) {
    if (n < 1) throw std::invalid_argument("kernel probe: n must be >= 1");
    product(n);  // warm-up (and ISA dispatch)
    double best = 0;  // products per second
    if (n == 1) {
      // Whole passes over every copy: each product reads its matrix from DRAM.
      const auto pass = [&] {
        const auto t0 = Clock::now();
        for (size_t c = 0; c < copies; ++c) product(1);
        return std::chrono::duration<double>(Clock::now() - t0).count();
      };
      if (!views.empty() && decode_variants_apply(t, views[0].pack)) {
        // Packed weights: every decode variant, and the rate of the fastest.
        const DecodeTuning tu = tune_decode_variant(t, runs, pass);
        out.tuned = true;
        out.decode = tu.choice;
        best = tu.passes_per_s * double(copies);
      } else {
        for (int r = 0; r < runs; ++r) best = std::max(best, double(copies) / pass());
      }
    } else {
      for (int r = 0; r < 2; ++r) {  // best of two: the first may pay for frequency ramp-up
        int64_t done = 0;
        const auto t0 = Clock::now();
        double el = 0;
        do {
          product(n);
          ++done;
          el = std::chrono::duration<double>(Clock::now() - t0).count();
        } while (el < seconds / 2);
        best = std::max(best, double(done) / el);
      }
    }
    g_sink += bits(double(y[0]));
    KernelPoint k;
    k.n = n;
    k.ops_per_s = best * 2.0 * double(n) * double(rows) * double(cols);
    k.weight_bytes_per_s = best * double(rb) * double(rows);
    out.points.push_back(k);
  }
  return out;
}

RatePoint measure_bandwidth(uint64_t buffer_bytes, int threads, int runs) {
  threads = resolve_threads(threads);
  if (buffer_bytes < (1u << 20)) throw std::invalid_argument("bandwidth buffer must be at least 1 MiB");
  if (runs < 1) throw std::invalid_argument("bandwidth runs must be >= 1");
  // Slices are whole 256-byte strides so every kernel's unrolled loop fits.
  const size_t slice = (buffer_bytes / size_t(threads)) / 256 * 256;
  const size_t total = slice * size_t(threads);
  // Mapped as the packed weights are (huge pages where granted), so the
  // figure is the rate their streams can reach.
  const auto unmap = [total](uint8_t* p) { unmap_large(p, total); };
  std::unique_ptr<uint8_t, decltype(unmap)> buf(nullptr, unmap);
  try {
    buf.reset(static_cast<uint8_t*>(map_large(total)));
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("probe: cannot allocate " + format_bytes(double(total)) + " for the bandwidth test");
  }
  // First touch by the reading thread (NUMA placement), with non-zero data.
  timed_parallel(threads, [&](int t) { std::memset(buf.get() + size_t(t) * slice, 0x5a + t, slice); });
  double best = 0;
  for (int r = 0; r < runs; ++r) {
    std::atomic<uint64_t> acc{0};
    const double s = timed_parallel(threads, [&](int t) { acc ^= read_best(buf.get() + size_t(t) * slice, slice); });
    g_sink ^= acc.load();
    best = std::max(best, double(total) / s);
  }
  return {threads, best};
}

PeakRate measure_peak(const std::string& path, int max_threads, double seconds) {
  const Kernel k = pick_kernel(path);
  max_threads = resolve_threads(max_threads);
  // Calibrate on one thread: double the iteration count until a run takes
  // long enough to time, then scale to the requested duration.
  int64_t iters = 1 << 14;
  double t = 0;
  for (;;) {
    const auto t0 = Clock::now();
    g_sink += bits(k.fn(iters));
    t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (t > 0.02 || iters > (int64_t(1) << 40)) break;
    iters *= 2;
  }
  iters = std::max<int64_t>(1, int64_t(double(iters) * seconds / t));
  PeakRate out;
  out.isa = k.isa;
  for (int th : thread_counts(max_threads)) {
    double best = 0;
    for (int r = 0; r < 2; ++r) {  // best of two: the first may pay for frequency ramp-up
      std::atomic<uint64_t> acc{0};
      const double s = timed_parallel(th, [&](int) { acc += bits(k.fn(iters)); });
      g_sink += acc.load();
      best = std::max(best, double(th) * double(iters) * k.ops_per_iter / s);
    }
    out.by_threads.push_back({th, best});
    out.peak = std::max(out.peak, best);
  }
  return out;
}

uint64_t machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

std::string machine_cpu_name() {
  // The first processor's model name, family and model: in VMs the name alone
  // ("AMD EPYC") is the same for cores whose best decode kernels differ.
  std::ifstream f("/proc/cpuinfo");
  std::string line, name, family, model;
  const auto value = [&](const std::string& l) {
    const size_t c = l.find(':');
    const size_t v = c == std::string::npos ? std::string::npos : l.find_first_not_of(" \t", c + 1);
    return v == std::string::npos ? std::string() : l.substr(v);
  };
  while (std::getline(f, line) && !line.empty()) {
    if (line.rfind("model name", 0) == 0) name = value(line);
    else if (line.rfind("cpu family", 0) == 0) family = value(line);
    else if (line.rfind("model", 0) == 0 && line.find_first_of(" \t") == 5) model = value(line);
  }
  if (name.empty()) return "unknown";
  return family.empty() || model.empty() ? name : name + " (family " + family + " model " + model + ")";
}

int64_t probe_stages(const ProbeOptions& opt) {
  // Bandwidth per thread count, three peaks, one matmul per type, the AMX
  // stages, attention.
  return int64_t(thread_counts(resolve_threads(opt.max_threads)).size()) + 3 + int64_t(opt.kernel_types.size()) +
         amx_probe_stages(opt) + 1;
}

HardwareProfile run_probe(const ProbeOptions& opt, const std::function<void(const std::string&)>& log) {
  const auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  HardwareProfile p;
  p.cpu = machine_cpu_name();
  p.logical_cores = cpu_features().logical_cores;
  p.mem_total_bytes = machine_memory_bytes();
  p.buffer_bytes = opt.buffer_bytes;
  p.created = now_utc();
  const int n = resolve_threads(opt.max_threads);
  for (int t : thread_counts(n)) {
    const RatePoint r = measure_bandwidth(opt.buffer_bytes, t, opt.runs);
    p.bandwidth_by_threads.push_back(r);
    p.bandwidth = std::max(p.bandwidth, r.rate);
    say("read bandwidth, " + std::to_string(t) + " thread(s): " + format_si(r.rate, "B/s"));
  }
  for (auto [name, dst] : {std::pair{"fp32", &p.fp32}, std::pair{"bf16", &p.bf16}, std::pair{"int8", &p.int8}}) {
    *dst = measure_peak(name, n, opt.flops_seconds);
    say(std::string(name) + " peak (" + dst->isa + "): " + format_si(dst->peak, "OP/s"));
  }

  if (!opt.kernel_types.empty()) {
    p.kernel_threads = n;
    p.kernel_rows = opt.kernel_rows;
    p.kernel_cols = opt.kernel_cols;
    for (const auto& type : opt.kernel_types) {
      KernelRate k = measure_kernel(type, opt.kernel_rows, opt.kernel_cols, opt.kernel_n, opt.buffer_bytes, n,
                                    std::max(2, std::min(opt.runs, 3)), opt.flops_seconds);
      const size_t mat = (row_bytes(weight_type_from_name(type), opt.kernel_cols) + 63) / 64 * 64 * size_t(opt.kernel_rows);
      p.kernel_buffer_bytes = std::max<uint64_t>(p.kernel_buffer_bytes, std::max<size_t>(2, (opt.buffer_bytes + mat - 1) / mat) * mat);
      std::string line = "matmul " + k.type + ":";
      for (const auto& q : k.points)
        line += " n=" + std::to_string(q.n) + " " + format_si(q.ops_per_s, "OP/s") + " (" +
                format_si(q.weight_bytes_per_s, "B/s") + " of weights)";
      if (k.tuned) {
        line += "; decode " + to_string(k.decode.variant) + " (" + format_ratio(k.decode.gain) + " the default)";
        p.decode.isa = decode_isa_name();
        p.decode.types.push_back(k.decode);
      }
      say(line);
      p.kernels.push_back(std::move(k));
    }
  }
  run_amx_probe(opt, n, p, say);
  p.attention = measure_attention(512, n, opt.flops_seconds);
  say("decode attention (f32 KV, ctx 512): " + format_si(p.attention.ops_per_s, "OP/s"));
  return p;
}

}  // namespace kvs::tools
