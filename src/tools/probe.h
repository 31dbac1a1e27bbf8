// `kvserve probe`: measures the two numbers a decode roofline needs on this
// machine (memory read bandwidth and peak arithmetic rate per ISA path) and
// keeps them in a JSON profile that `kvserve plan --profile` reads back.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "kernels/quant.h"
#include "tools/kernel_choice.h"

namespace kvs::tools {

struct ProbeOptions {
  uint64_t buffer_bytes = 1ull << 30;  // streamed buffer; must dwarf the last-level cache
  int max_threads = 0;                 // 0 = every logical core
  int runs = 5;                        // best of this many passes per thread count
  double flops_seconds = 0.2;          // target duration of one FLOP measurement
  // Weight types whose real kvs::matmul is timed (lower-case ggml names); empty: none.
  std::vector<std::string> kernel_types = default_kernel_types();
  int64_t kernel_rows = 8192, kernel_cols = 2048;  // one weight matrix (a 1.1B-class FFN projection)
  std::vector<int> kernel_n = {1, 16, 128};         // activation rows: decode, batched decode, prefill
  // Where AMX is in use: the n values at which tiles and VNNI are timed
  // side by side per AMX type, on weights cycled through this many bytes.
  std::vector<int> amx_n = {2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128};
  uint64_t amx_buffer_bytes = 256ull << 20;

  static std::vector<std::string> default_kernel_types() { return {"f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}; }
};

struct RatePoint {
  int threads = 0;
  double rate = 0;  // bytes/s for bandwidth, ops/s for compute
};

// One arithmetic path ("fp32", "bf16", "int8") as the best ISA here runs it.
struct PeakRate {
  std::string isa;  // e.g. "avx512 vfmadd", "avx512_bf16 vdpbf16ps", "avx512_vnni vpdpbusd", "scalar"
  std::vector<RatePoint> by_threads;
  double peak = 0;  // best over thread counts
};

// The engine's own kvs::matmul timed on one weight type: Y[n, rows] =
// X[n, cols] · W^T, cycling through copies of W that together exceed the
// last-level cache, so every product streams its weights from DRAM as decode
// does. ops = 2·n·rows·cols; weight bytes = the stored matrix.
struct KernelPoint {
  int n = 0;
  double ops_per_s = 0;           // achieved, 2·n·rows·cols per product
  double weight_bytes_per_s = 0;  // stored weight bytes per second of products
};
struct KernelRate {
  std::string type;  // lower-case ggml name: "f16", "q8_0", "q4_0", ...
  std::vector<KernelPoint> points;  // ascending n
  const KernelPoint* at(int n) const;  // exact n, or nullptr
  // The point whose n is nearest `n` in log distance (ties: the smaller n);
  // nullptr when there are no points.
  const KernelPoint* nearest(double n) const;
  // n = 1 on packed weights: the decode variant chosen (n = 1's rate is its).
  bool tuned = false;
  DecodeChoice decode;
};

// The engine's decode attention (attention_group, paged f32 cache, the 1.1B
// shape: 32 query / 8 kv heads of 64) at `ctx` keys per token, tokens of
// many sequences spread over `threads` threads. ops = 4·heads·head_dim·ctx
// per token (QKᵀ and P·V).
struct AttentionRate {
  int ctx = 0;
  int threads = 0;
  double ops_per_s = 0;  // 0 = not measured
};

struct HardwareProfile {
  std::string cpu;            // /proc/cpuinfo model name
  int logical_cores = 0;
  uint64_t mem_total_bytes = 0;
  uint64_t buffer_bytes = 0;  // what the bandwidth test streamed
  std::vector<RatePoint> bandwidth_by_threads;
  double bandwidth = 0;       // best read bandwidth, bytes/s
  PeakRate fp32, bf16, int8;
  PeakRate int8_amx;          // tdpbssd where AMX is in use (peak 0 otherwise, and in older profiles)
  PeakRate bf16_amx;          // tdpbf16ps where AMX-BF16 is usable (likewise)
  // vfmadd231ps while tile products run, where AMX is in use (likewise):
  // the rate of the exact tile kernels' float chain, which the tile unit
  // slows (docs/PERFORMANCE.md).
  PeakRate fp32_amx;
  // Real kernel rates (absent in profiles written before they were measured).
  int kernel_threads = 0;
  int64_t kernel_rows = 0, kernel_cols = 0;
  uint64_t kernel_buffer_bytes = 0;  // all copies of the matrix together
  std::vector<KernelRate> kernels;
  const KernelRate* kernel(const std::string& type) const;  // case-insensitive; nullptr if not measured
  AttentionRate attention;    // absent in older profiles (ops_per_s 0)
  DecodeChoices decode;       // the decode kernel variants chosen here (absent in older profiles)
  AmxChoices amx;             // where AMX tiles take over, per type (absent without AMX)
  std::string created;        // UTC ISO-8601
};

// Runs the measurements; `log` (optional) receives one line per finished step.
HardwareProfile run_probe(const ProbeOptions& opt, const std::function<void(const std::string&)>& log = {});
// How many times run_probe calls `log`: one per measurement (a progress bar's total).
int64_t probe_stages(const ProbeOptions& opt);

// Single measurements, exposed for tests and quick checks.
RatePoint measure_bandwidth(uint64_t buffer_bytes, int threads, int runs);
// path: fp32|bf16|int8|int8_amx|bf16_amx|fp32_amx (the AMX ones throw std::invalid_argument where their tiles are
// not usable).
PeakRate measure_peak(const std::string& path, int max_threads, double seconds);
// Times kvs::matmul for `type` (a ggml type name) on a rows×cols matrix copied
// until the copies fill at least buffer_bytes, on a ThreadPool of `threads`;
// n = 1 is the best of `runs` full passes over the copies, larger n run for
// about `seconds`. Throws std::invalid_argument for unknown / unsupported types.
KernelRate measure_kernel(const std::string& type, int64_t rows, int64_t cols, const std::vector<int>& ns,
                          uint64_t buffer_bytes, int threads, int runs, double seconds);

// AMX tiles against VNNI on the real matmul for `type` (an AMX type) at each
// n (probe_amx.cpp): a rows x cols matrix copied until the copies fill
// buffer_bytes, Panel16 as Model::load packs it, both paths over every copy
// in turn, `rounds` rounds, the best pass of each; min_rows from
// amx_crossover(). Leaves the type's threshold as it was. Throws
// std::invalid_argument where AMX is not in use or the type has no AMX kernels.
AmxChoice measure_amx_rows(const std::string& type, int64_t rows, int64_t cols, const std::vector<int>& ns,
                           uint64_t buffer_bytes, int threads, int rounds);
// The AMX int8 peak loop: `iters` rounds of 4 independent 16x16x64
// tdpbssd (131072 operations each); the tile state is released after.
double amx_int8_loop(int64_t iters);
double amx_bf16_loop(int64_t iters);  // the same with tdpbf16ps
// `iters` rounds of 12 independent 512-bit FMAs (384 operations), a tdpbssd
// every fourth round, as the exact tile kernels interleave them.
double fp32_beside_amx_loop(int64_t iters);
// run_probe's AMX part where AMX is in use (nothing otherwise): the int8
// tile peak (p.int8_amx), the FMA rate beside tiles (p.fp32_amx) and the crossover of every AMX type among
// opt.kernel_types (p.amx), one `say` line each; how many lines that is.
void run_amx_probe(const ProbeOptions& opt, int threads, HardwareProfile& p,
                   const std::function<void(const std::string&)>& say);
int64_t amx_probe_stages(const ProbeOptions& opt);
std::string format_amx(const HardwareProfile& p);  // the profile's AMX lines ("" without)

// Times the decode attention kernel for about `seconds` (probe_attention.cpp).
AttentionRate measure_attention(int ctx, int threads, double seconds);
nlohmann::json profile_to_json(const HardwareProfile& p);
// Throws std::invalid_argument naming the missing or malformed key.
HardwareProfile profile_from_json(const nlohmann::json& j);
void save_profile(const HardwareProfile& p, const std::string& path);  // creates parent dirs
HardwareProfile load_profile(const std::string& path);                 // throws with the path in the message
// $KVS_PROFILE, else $XDG_CONFIG_HOME/kvserve/profile.json, else ~/.config/kvserve/profile.json.
std::string default_profile_path();
std::string format_profile(const HardwareProfile& p);  // human-readable summary

std::string lower_ascii(std::string s);
// A weight type by its ggml name, any case; throws std::invalid_argument for
// unknown or unsupported types.
GgmlType weight_type_from_name(const std::string& name);

// Physical memory of this machine (sysconf), model name and logical cores.
uint64_t machine_memory_bytes();
std::string machine_cpu_name();

}  // namespace kvs::tools
