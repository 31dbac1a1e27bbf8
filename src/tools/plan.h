// `kvserve plan`: KV-cache sizing, capacity and a decode roofline for a model
// shape on a hardware profile. make_plan() is pure computation returning plain
// data; plan_to_json / format_plan / write_plan_plots render it.
//
// The decode model: one step of a batch of B sequences at context S reads the
// streamed weights once plus every sequence's K/V,
//   bytes(B) = W + B·S·kv_bytes_per_token
// and does B·(2·matmul_params + 4·layers·heads·head_dim·S) operations (the
// matmuls, plus QKᵀ and A·V over S positions). Its time is the larger of
// bytes / bandwidth and ops / peak; tok/s = B / time.
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
};
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
};

struct PrefillEstimate {
  int64_t tokens = 0;
  double ops = 0, bytes = 0, seconds = 0, tok_s = 0;
  bool compute_bound = false;
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
  PrefillEstimate prefill;
  std::vector<std::string> notes;
};

// Throws std::invalid_argument for inconsistent input (batch < 1, ...). A
// memory budget too small for the weights is not thrown: it is reported in
// capacity_error so the KV figures are still printed.
PlanResult make_plan(PlanInput in);
// One roofline point at any (batch, context); used by make_plan and the plots.
RooflinePoint roofline_point(const PlanResult& p, int64_t batch, int64_t ctx);

nlohmann::json plan_to_json(const PlanResult& p);
std::string format_plan(const PlanResult& p);
// Writes kv_vs_context.svg, decode_roofline.svg and decode_vs_context.svg
// into dir (created if needed); returns the paths written.
std::vector<std::string> write_plan_plots(const PlanResult& p, const std::string& dir);

}  // namespace kvs::tools
