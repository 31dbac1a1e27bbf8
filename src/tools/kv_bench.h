// Model-based KV measurements (`kvserve kv-bench`):
//  - decode speed through a paged, scattered block table (PagedEngine over a
//    fragmented pool) vs the contiguous private table of LocalSequence;
//  - time to first token of a request whose long system prompt is already in
//    the prefix cache vs the same request on a cold cache.
#pragma once
#include <cstdint>
#include <string>

#include "kvserve/engine.h"

namespace kvs::tools {

struct KvBenchOptions {
  int block_size = 16;
  int n_prompt = 128;        // decode test: context before decoding
  int n_gen = 128;           // decode test: tokens decoded
  int system_tokens = 1000;  // TTFT test: shared system prompt
  int user_tokens = 24;      // TTFT test: per-request suffix
  int reps = 5;              // repetitions (median reported)
  uint64_t seed = 42;
};

struct KvBenchResult {
  double contiguous_tok_s = 0, paged_tok_s = 0;  // decode, median of reps
  double paged_vs_contiguous = 0;                // paged / contiguous speed
  double ttft_cold_ms = 0, ttft_cached_ms = 0;   // median of reps
  int64_t cold_forward_tokens = 0, cached_forward_tokens = 0;  // per request
  int cached_tokens = 0;                         // prompt tokens served from the cache
};

KvBenchResult run_kv_bench(Engine& engine, const KvBenchOptions& o);
std::string kv_bench_table(const Engine& engine, const KvBenchOptions& o, const KvBenchResult& r);

}  // namespace kvs::tools
