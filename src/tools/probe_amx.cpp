// `kvserve probe` on a CPU with AMX: the int8 tile peak beside the VNNI
// one, and per weight type the n from which the AMX tile kernels beat the
// VNNI kernels on the real matmul (the threshold kernels/amx_rows.h holds).
//
// Both paths run on the same Panel16 copies, product by product over copies
// that together exceed the caches (batched decode streams its weights from
// DRAM), alternating path by path inside each round so drift hits both.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>

#include "kernels/amx_rows.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/target_region.h"
#include "kernels/threadpool.h"
#include "kernels/weight_pack.h"
#include "tools/probe.h"
#include "tools/units.h"

namespace kvs::tools {
namespace {

using Clock = std::chrono::steady_clock;

bool amx_in_use() {
  set_isa_override(Isa::Amx);
  const bool ok = active_isa() == Isa::Amx;
  clear_isa_override();
  return ok;
}

// Copies of one pseudo-random matrix of type t, each with its Panel16 copy.
struct PackedCopies {
  std::vector<uint8_t> file;  // [rows, row_bytes]: the views' `data` (not read by the packed kernels)
  PackedArena arena;          // [copies][packed_size]
  std::vector<WeightView> views;
};

PackedCopies make_copies(GgmlType t, int64_t rows, int64_t cols, uint64_t buffer_bytes) {
  PackedCopies c;
  const size_t rb = row_bytes(t, cols);
  c.file.resize(rb * size_t(rows));
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(cols));  // [cols]
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = nd(rng);
    quantize_row(t, row.data(), c.file.data() + size_t(r) * rb, cols);
  }
  WeightView w{t, c.file.data(), rows, cols, rb};
  const size_t pb = (packed_size(w, PackLayout::Panel16) + 4095) / 4096 * 4096;
  const size_t copies = std::max<size_t>(2, (buffer_bytes + pb - 1) / pb);
  c.arena = PackedArena(pb * copies);
  pack_panels_into(w, PackLayout::Panel16, c.arena.data());
  for (size_t k = 1; k < copies; ++k) std::memcpy(c.arena.data() + k * pb, c.arena.data(), pb);
  for (size_t k = 0; k < copies; ++k) {
    WeightView v = w;
    v.packed = c.arena.data() + k * pb;
    v.pack = PackLayout::Panel16;
    c.views.push_back(v);
  }
  return c;
}

}  // namespace

AmxChoice measure_amx_rows(const std::string& type, int64_t rows, int64_t cols, const std::vector<int>& ns,
                           uint64_t buffer_bytes, int threads, int rounds) {
  const GgmlType t = weight_type_from_name(type);
  if (!amx_tile_type(t)) throw std::invalid_argument("amx probe: " + type + " has no AMX kernels");
  if (!amx_in_use()) throw std::invalid_argument("amx probe: AMX is not in use on this machine");
  if (rows < 1 || rounds < 1) throw std::invalid_argument("amx probe: rows and rounds must be >= 1");
  PackedCopies c = make_copies(t, rows, cols, buffer_bytes);
  std::vector<int> sorted = ns;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || sorted.front() < 1) throw std::invalid_argument("amx probe: n values must be >= 1");
  std::vector<float> x(size_t(sorted.back()) * size_t(cols)), y(size_t(sorted.back()) * size_t(rows));
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  ThreadPool pool(threads > 0 ? threads : cpu_features().logical_cores);
  const int saved = amx_min_rows(t);
  set_amx_min_rows(t, 1);  // tiles at every n while timing them
  AmxChoice out;
  out.type = lower_ascii(type_name(t));
  for (int n : sorted) {
    double best[2] = {0, 0};  // passes per second: [vnni, amx]
    for (int r = 0; r < rounds; ++r)
      for (int path = 0; path < 2; ++path) {
        set_isa_override(path == 0 ? Isa::Avx512 : Isa::Amx);
        matmul(c.views[0], x.data(), cols, n, y.data(), rows, pool);  // dispatch, tile layout buffers
        const auto t0 = Clock::now();
        for (const WeightView& v : c.views) matmul(v, x.data(), cols, n, y.data(), rows, pool);
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (s > 0) best[path] = std::max(best[path], 1.0 / s);
      }
    const double ops = double(c.views.size()) * 2.0 * double(n) * double(rows) * double(cols);
    out.points.push_back({n, best[0] * ops, best[1] * ops});
  }
  clear_isa_override();
  set_amx_min_rows(t, saved);
  out.min_rows = amx_crossover(out.points);
  return out;
}

namespace {

std::string ratio(double amx, double vnni) { return format_ratio(amx / std::max(vnni, 1.0)); }

std::string rows_text(int min_rows) { return min_rows >= kAmxNever ? "never" : "n >= " + std::to_string(min_rows); }

// The kernel types the AMX crossover is measured for (none without AMX).
std::vector<std::string> amx_probe_types(const ProbeOptions& opt) {
  std::vector<std::string> v;
  if (active_isa() != Isa::Amx) return v;
  for (const auto& t : opt.kernel_types)
    if (amx_tile_type(weight_type_from_name(t))) v.push_back(t);
  return v;
}

}  // namespace

int64_t amx_probe_stages(const ProbeOptions& opt) {
  return active_isa() == Isa::Amx ? 2 + int64_t(amx_bf16_active()) + int64_t(amx_probe_types(opt).size()) : 0;
}

void run_amx_probe(const ProbeOptions& opt, int threads, HardwareProfile& p,
                   const std::function<void(const std::string&)>& say) {
  if (active_isa() != Isa::Amx) return;  // KVS_ISA=avx512 (or lower): the profile of the VNNI machine
  p.int8_amx = measure_peak("int8_amx", threads, opt.flops_seconds);
  say("int8_amx peak (" + p.int8_amx.isa + "): " + format_si(p.int8_amx.peak, "OP/s") + ", " +
      ratio(p.int8_amx.peak, p.int8.peak) + " the VNNI one");
  p.fp32_amx = measure_peak("fp32_amx", threads, opt.flops_seconds);  // the exact tile kernels' float chain
  say("fp32 beside amx tiles (" + p.fp32_amx.isa + "): " + format_si(p.fp32_amx.peak, "OP/s") + ", " +
      ratio(p.fp32_amx.peak, p.fp32.peak) + " the fp32 one");
  if (amx_bf16_active()) {  // the float-weight products of --prefill-precision bf16
    p.bf16_amx = measure_peak("bf16_amx", threads, opt.flops_seconds);
    say("bf16_amx peak (" + p.bf16_amx.isa + "): " + format_si(p.bf16_amx.peak, "OP/s") + ", " +
        ratio(p.bf16_amx.peak, p.fp32.peak) + " the fp32 one");
  }
  for (const auto& type : amx_probe_types(opt)) {
    AmxChoice a = measure_amx_rows(type, opt.kernel_rows, opt.kernel_cols, opt.amx_n, opt.amx_buffer_bytes, threads,
                                   std::max(2, std::min(opt.runs, 3)));
    std::string line = "amx " + a.type + ": tiles " + rows_text(a.min_rows) + " (amx/vnni";
    for (const auto& q : a.points) line += " n=" + std::to_string(q.n) + " " + ratio(q.amx, q.vnni);
    say(line + ")");
    p.amx.types.push_back(std::move(a));
  }
}

std::string format_amx(const HardwareProfile& p) {
  if (p.amx.empty()) return "";
  std::string o = "amx tiles over vnni (tiles from the n whose points above gain most; amx/vnni per n):\n";
  for (const AmxChoice& a : p.amx.types) {
    o += "  " + a.type + ": " + rows_text(a.min_rows) + " ";
    for (const AmxPoint& q : a.points) o += " n=" + std::to_string(q.n) + " " + ratio(q.amx, q.vnni);
    o += "\n";
  }
  return o;
}

namespace {
// Every tile [16, 64] bytes (an asm instruction: no target needed here).
void configure_tiles() {
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (int i = 0; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));  // the whole struct as the operand (GCC 12's intrinsic names 8 bytes)
}
}  // namespace

KVS_TARGET_BEGIN("amx-tile,amx-int8,amx-bf16")

namespace {

// Four tile products per iteration (int8 tdpbssd or bf16 tdpbf16ps) on four
// independent accumulators, which cover the product latency. Returns a sum
// of the results, so the loop is not dropped.
template <bool BF16>
double amx_loop(int64_t iters) {
  configure_tiles();
  alignas(64) int8_t a[16 * 64], b[16 * 64];   // [16, 64] bytes each
  for (int i = 0; i < 16 * 64; ++i) a[i] = int8_t(i % 7 - 3), b[i] = int8_t(i % 5 - 2);
  if (BF16)  // bf16 2^-20 everywhere: the sums stay finite and normal
    for (int i = 0; i < 16 * 64; i += 2) a[i] = b[i] = int8_t(0x80), a[i + 1] = b[i + 1] = int8_t(0x35);
  alignas(64) int32_t c[4][16 * 16];  // [4][16, 16] int32 or float
  __asm__ volatile("" ::"m"(a), "m"(b));
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    if constexpr (BF16) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    } else {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
  }
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
  _tile_release();
  double s = 0;
  for (const auto& t : c) {
    float f[2];
    std::memcpy(f, &t[0], 4), std::memcpy(f + 1, &t[255], 4);
    s += BF16 ? double(f[0]) + double(f[1]) : double(t[0]) + double(t[255]);
  }
  return s;
}

}  // namespace

double amx_int8_loop(int64_t iters) { return amx_loop<false>(iters); }
double amx_bf16_loop(int64_t iters) { return amx_loop<true>(iters); }

KVS_TARGET_END()

KVS_TARGET_BEGIN("avx512f,amx-tile,amx-int8")

double fp32_beside_amx_loop(int64_t iters) {
  configure_tiles();
  alignas(64) int8_t a[16 * 64] = {}, b[16 * 64] = {};
  __asm__ volatile("" ::"m"(a), "m"(b));
  _tile_loadd(4, a, 64);
  _tile_loadd(6, b, 64);
  _tile_zero(0);
  __m512 x = _mm512_set1_ps(0.999f);
  const __m512 y = _mm512_set1_ps(1e-4f);
#define KVS_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define D(i) __m512 a##i = _mm512_set1_ps(1.0f + float(i));
  KVS_REP12(D)
#undef D
  for (int64_t it = 0; it < iters; ++it) {
    if ((it & 3) == 0) _tile_dpbssd(0, 4, 6);
    __asm__("" : "+v"(x));
#define F(i) a##i = _mm512_fmadd_ps(a##i, x, y);
    KVS_REP12(F)
#undef F
  }
  _tile_release();
  __m512 s = _mm512_setzero_ps();
#define S(i) s = _mm512_add_ps(s, a##i);
  KVS_REP12(S)
#undef S
#undef KVS_REP12
  return double(_mm512_reduce_add_ps(s));
}

KVS_TARGET_END()

}  // namespace kvs::tools
