// `kvserve plan`: KV-cache sizing, capacity and a decode roofline for a model
// shape on a hardware profile. make_plan() is pure computation returning plain
// data; plan_to_json / format_plan / write_plan_plots render it.
//
// The decode model: one step of a batch of B sequences at context S reads the
// streamed weights once plus every sequence's K/V,
//   bytes(B) = W + B·S·kv_bytes_per_token
// and does B·(2·matmul_params + 4·layers·heads·head_dim·S) operations (the
// matmuls, plus QKᵀ and A·V over S positions). Its time is the larger of
// bytes / bandwidth and ops / peak; tok/s = B / time. That is the ceiling.
//
// The expected rate uses the engine's measured kernel rates (`kvserve probe`
// times kvs::matmul per weight type at n = 1, 16, 128 activation rows; see
// KernelRate). A product of n rows over W weight bytes takes W·s(n), s(n) the
// measured seconds per weight byte, interpolated linearly in n between the
// measured points (time per product ≈ fixed streaming cost + a cost per row)
// and proportional to n past the largest (compute-bound). Per weight type t
// of the model, W_t its streamed bytes:
//   t_t(B) = max(W_t / bandwidth, W_t · s_t(B))
// At B = 1 this is W_t / min(bandwidth, kernel n=1 bytes/s); at a measured
// n it is the kernel's own ops rate. The engine runs the matrices and the
// attention one after the other, so the step is their sum:
//   t_step = Σ_t t_t(B) + max(K/V bytes / bandwidth, attention ops / fp32 peak)
// A type with no measured kernel falls back to max(W_t / bandwidth,
// 2·B·params_t / peak of its path), so old profiles give the roofline terms.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "kv/capacity.h"
#include "tools/presets.h"
#include "tools/probe.h"

namespace kvs::tools {

struct Hardware {
  std::string source;     // "flags", "profile <path>", "probe", or a mix
  uint64_t mem_bytes = 0; // memory budget for weights + scratch + KV
  double bandwidth = 0;   // bytes/s; 0 = unknown (no roofline)
  double flops_fp32 = 0, flops_bf16 = 0, flops_int8 = 0;  // ops/s; 0 = unknown
  double flops_for(const std::string& path) const;  // path: fp32 | bf16 | int8
  std::vector<KernelRate> kernels;  // measured kvs::matmul rates; empty: expected = roofline
  double attention_ops = 0;         // measured decode attention ops/s; 0: expected uses flops_fp32
  const KernelRate* kernel(const std::string& type) const;  // case-insensitive; nullptr if absent
};

// The streamed matrices of one weight type (lower-case ggml name).
struct WeightPart {
  std::string type;
  double bytes = 0;   // streamed bytes of this type
  double params = 0;  // matmul parameters of this type
};
// Compute path a weight type runs on: fp32 (f32, f16, bf16: widened exactly
// and multiplied with FP32 FMA), else int8 (quantized activations, VNNI).
std::string compute_path_for_type(const std::string& type);
Hardware hardware_from_profile(const HardwareProfile& p, const std::string& source);

struct PlanInput {
  ModelShape model;       // priced (weight bytes filled)
  Hardware hw;
  KvFormat kv = KvFormat::f16();
  int block_size = 16;
  int64_t batch = 1;
  int64_t ctx = 0;         // 0: min(2048, trained context)
  int64_t prompt = -1;     // -1: min(512, ctx / 2)
  int64_t max_tokens = -1; // -1: min(256, ctx - prompt)
  double headroom = 0.05;
  int64_t scratch_bytes = -1;    // -1: default_scratch_bytes(model)
  std::vector<int64_t> batches;  // roofline table rows; empty: 1, 2, 4 ... 256
  // Streamed weights by type (from the GGUF tensor table). Empty: the whole
  // model as the first word of model.weight_type.
  std::vector<WeightPart> weight_mix;
  // Read rates of the KV tiers (--tier-disk-read, --tier-redis-read), bytes/s.
  double disk_read_bps = 2e9, redis_read_bps = 1.25e9;
  // The link between a prefill and a decode worker (--link), bytes/s.
  double link_bps = 25e9;
  // Most tokens one step appends to a sequence: bounds a windowed KV
  // table's blocks in admission (window_block_cap).
  int max_step_tokens = 512;
};

// The hybrid KV cache of a model whose layers differ in window: its tables
// and one sequence's K/V bytes with every layer at full size, with the
// windowed tables at their window between steps, and at admission's bound.
struct HybridKvRow {
  int64_t ctx = 0;
  uint64_t full_bytes = 0, hybrid_bytes = 0, bound_bytes = 0;
  int64_t full_blocks = 0, hybrid_blocks = 0;  // blocks of n_layers slots / of S slots (all tables)
  double saving = 0;                           // full_bytes / hybrid_bytes
};
struct HybridKv {
  std::vector<KvTableShape> tables;  // empty: one table (no hybrid cache)
  uint64_t layer_token_bytes = 0;    // K and V of one token in one layer
  std::vector<HybridKvRow> rows;     // 8k, 32k and the plan's context
};

// Activations of one 512-token step in f32 (residual, attention, FFN, logits).
int64_t default_scratch_bytes(const ModelShape& m);

struct KvFormatRow {
  std::string format;
  uint64_t bytes_per_token = 0, mha_bytes_per_token = 0, mqa_bytes_per_token = 0;
  uint64_t cache_bytes = 0;           // at the plan's batch and context
  double crossover_b1 = 0, crossover_b32 = 0;  // context where the cache equals the weights
};

struct Crossover {
  int64_t batch = 0;
  double context = 0;          // W / (B · kv_bytes_per_token), exact quotient
  int64_t context_tokens = 0;  // first whole context with cache >= weights
  bool within_trained_context = false;
};

struct RooflinePoint {
  int64_t batch = 0;
  double weight_bytes = 0, kv_bytes = 0, bytes_per_step = 0;
  double ops_per_step = 0, intensity = 0;  // ops per byte read
  double t_memory = 0, t_compute = 0;      // seconds per step (t_compute 0 if peak unknown)
  double tok_s = 0;
  bool memory_bound = true;
  bool fits = true;  // B sequences of ctx tokens fit in the usable KV blocks
  // Expected, from measured kernel rates (equal to the roofline terms where
  // no kernel rate is known): see the top of this file.
  double t_weights = 0;    // Σ over weight types of max(stream, compute)
  double t_attention = 0;  // max(K/V read, attention ops at the fp32 peak)
  double t_expected = 0, tok_s_expected = 0;
  std::string limit;  // what binds the largest term: "bandwidth", "kernel n=1", "kernel n=16", "KV read", ...
};

struct PrefillEstimate {
  int64_t tokens = 0;
  double ops = 0, bytes = 0, seconds = 0, tok_s = 0;
  bool compute_bound = false;
};

// Loading a prompt's K/V from a lower tier instead of prefilling it: the
// prompt's full blocks at kv_bytes_per_token, read at each tier's rate.
struct TierReadEstimate {
  int64_t tokens = 0;  // prompt tokens in full blocks
  double bytes = 0, disk_s = 0, redis_s = 0;
};

// Disaggregated serving: shipping a prefilled prompt's K/V to a decode
// worker. Every block the prompt touches travels (the tail block whole);
// the formula's bytes are tokens x kv_bytes_per_token.
struct TransferEstimate {
  int64_t tokens = 0;
  double formula_bytes = 0, wire_bytes = 0, seconds = 0;
  double breakeven_bps = 0;  // link rate at which shipping takes as long as prefilling again
};

struct PlanResult {
  PlanInput in;  // with defaults resolved
  uint64_t kv_bytes_per_token = 0, mha_bytes_per_token = 0, mqa_bytes_per_token = 0;
  double gqa_saving = 1;    // n_heads / n_kv_heads
  uint64_t cache_bytes = 0; // batch × ctx × kv_bytes_per_token
  std::vector<KvFormatRow> formats;
  std::vector<Crossover> crossovers;  // batch 1, 32 and the plan's batch
  CapacityInput capacity_input;
  CapacityResult capacity;
  std::string capacity_error;  // empty when the estimate succeeded
  bool has_roofline = false;   // bandwidth known
  std::string compute_path;    // fp32 | bf16 | int8
  double peak_ops = 0;         // of that path; 0 = unknown
  double ridge_intensity = 0;  // ops/byte where compute time equals memory time
  int64_t kv_overtakes_batch = 0;   // first batch whose K/V reads exceed the weight reads
  int64_t compute_bound_batch = 0;  // first compute-bound batch; 0 = never (KV grows as fast)
  std::vector<RooflinePoint> roofline;
  std::vector<WeightPart> weight_mix;  // resolved
  bool has_kernel_rates = false;       // some weight type had a measured kernel
  PrefillEstimate prefill;
  TierReadEstimate tier_read;
  TransferEstimate transfer;
  HybridKv hybrid;
  std::vector<std::string> notes;
};

// Throws std::invalid_argument for inconsistent input (batch < 1, ...). A
// memory budget too small for the weights is not thrown: it is reported in
// capacity_error so the KV figures are still printed.
PlanResult make_plan(PlanInput in);
// Seconds per weight byte of kvs::matmul at n rows (see the top of this file);
// label names the measured point(s) used. k.points must be non-empty, ascending.
struct KernelTime {
  double seconds_per_byte = 0;
  std::string label;
};
KernelTime kernel_seconds_per_byte(const KernelRate& k, double n);
// Blocks one sequence of `ctx` tokens holds at most (every KV table of the
// hybrid cache, each windowed one at admission's bound).
int64_t sequence_blocks(const PlanResult& p, int64_t ctx);
// One roofline point at any (batch, context); used by make_plan and the plots.
RooflinePoint roofline_point(const PlanResult& p, int64_t batch, int64_t ctx);

nlohmann::json plan_to_json(const PlanResult& p);
std::string format_plan(const PlanResult& p);
// Writes kv_vs_context.svg, decode_roofline.svg and decode_vs_context.svg
// into dir (created if needed); returns the paths written.
std::vector<std::string> write_plan_plots(const PlanResult& p, const std::string& dir);

}  // namespace kvs::tools
