// Memory simulation of KV allocation policies under a mixed-length workload,
// without a model: how much of the allocated KV memory holds tokens, and how
// many sequences run at once in a fixed budget.
//
// Workload: n_requests, all queued at t = 0 (a saturated server), prompt
// lengths uniform in [prompt_min, prompt_max], output lengths uniform in
// [output_min, output_max]; every request may generate up to max_tokens.
// Each step admits FIFO while memory allows, prefills each new request in
// one step and decodes one token for every other running request.
//
// Policies:
//   Paged               the real KvManager (block_size slots per block,
//                       blocks taken as tokens arrive; when a decode finds
//                       no block, the newest request is preempted and later
//                       recomputed, as vLLM does)
//   ReservePromptMax    a contiguous buffer of prompt + max_tokens per
//                       request, reserved at admission
//   ReserveMaxContext   a contiguous buffer of max_ctx per request (what a
//                       server that does not know lengths must reserve)
// Contiguous policies are modelled with perfect compaction (no external
// fragmentation), which flatters them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvs::tools {

enum class KvSimPolicy { Paged, ReservePromptMax, ReserveMaxContext };
const char* to_string(KvSimPolicy p);

struct KvSimConfig {
  int64_t budget_tokens = 65536;  // KV capacity in token slots
  int block_size = 16;
  int prompt_min = 16, prompt_max = 2048;
  int output_min = 16, output_max = 512;
  int max_tokens = 512;   // per-request generation limit
  int max_ctx = 2560;     // model context (>= prompt_max + max_tokens)
  int n_requests = 2000;
  double watermark = 0.01;  // paged: fraction of blocks admission keeps free for growth
  uint64_t seed = 1;
};

struct KvSimResult {
  KvSimPolicy policy = KvSimPolicy::Paged;
  int64_t steps = 0, steady_steps = 0;  // steady: steps while requests were still waiting
  int64_t completed = 0, preemptions = 0;
  // Averages over steady steps:
  double mean_running = 0;      // sequences resident at once
  double mean_allocated = 0;    // token slots allocated
  double mean_tokens = 0;       // token slots holding a token
  double waste_fraction = 0;    // (allocated - tokens) / allocated
  double utilization = 0;       // tokens / budget
  double max_waste_fraction = 0;  // worst single steady step
};

// Throws std::invalid_argument for inconsistent configurations (a budget
// that cannot hold one max-length request, empty ranges, ...).
KvSimResult run_kv_sim(const KvSimConfig& cfg, KvSimPolicy policy);
std::vector<KvSimResult> run_kv_sim_all(const KvSimConfig& cfg);

// Markdown table of the results (one row per policy).
std::string kv_sim_table(const KvSimConfig& cfg, const std::vector<KvSimResult>& rs);

}  // namespace kvs::tools
