// The quality price of a KV cache policy (`kvserve eval`).
//
// kv_eval: perplexity with llama.cpp's protocol (engine/perplexity.h), so an
// f32 cache gives the same number as `kvserve perplexity`, plus the mean KL
// divergence KL(p_f32 || p_policy) of the next-token distributions over the
// scored tokens, against an f32 cache run on the same chunks (on
// KvEvalOptions::reference when set: an fp32-matmul load of the same model,
// so a bf16-matmul engine's price is measured too).
//
// stream_eval: one long text token by token through a window policy
// (StreamingLLM sinks + window, plain window, context shift), scoring every
// next token: PPL per segment of the stream and the peak KV memory. The
// oracle is sliding-window recompute: each token is predicted from the last
// W tokens recomputed from scratch (exact window attention, W times the
// work), evaluated every `oracle_stride` tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/kv_cache.h"
#include "kv/window_policy.h"
#include "kvserve/engine.h"

namespace kvs {

struct KvEvalOptions {
  int block_size = 16;
  KvCacheOptions cache;
  WindowPolicy window;  // applied to the policy run, never to the f32 reference
  Engine* reference = nullptr;  // runs the f32 reference; null: the evaluated engine
};

struct KvEvalResult {
  double ppl = 0, ppl_ref = 0;  // policy cache, f32 cache
  double kl = 0;                // mean KL(p_f32 || p_policy), nats per token
  double top1 = 0;              // share of scored tokens whose argmax agrees with f32
  double kv_bytes_per_token = 0;  // K+V of all layers per cached token (quantized: metadata included)
  int64_t n_scored = 0;
  int n_chunks = 0;
};

// progress(done_chunks, total_chunks, running_ppl)
KvEvalResult kv_eval(Engine& e, const std::vector<int>& tokens, int ctx, int bos, const KvEvalOptions& o,
                     const std::function<void(int, int, double)>& progress = nullptr);

struct StreamEvalOptions {
  int block_size = 16;
  KvCacheOptions cache;
  WindowPolicy window;     // kind None with oracle: recompute over `oracle_window`
  bool oracle = false;     // sliding-window recompute instead of a cache policy
  int oracle_window = 256;
  int oracle_stride = 1;   // score every k-th token in oracle mode
  int segment = 1000;      // tokens per PPL point
};

struct StreamEvalResult {
  std::vector<std::pair<int64_t, double>> segment_ppl;  // (tokens processed at segment end, PPL of the segment)
  double ppl = 0;            // over all scored tokens
  int64_t n_scored = 0;
  int64_t peak_kv_bytes = 0; // blocks held at the peak × block bytes (+ residual)
  int peak_blocks = 0;
};

// Scores tokens[1..] from tokens[0..i]; the sequence starts with tokens[0].
StreamEvalResult stream_eval(Engine& e, const std::vector<int>& tokens, const StreamEvalOptions& o,
                             const std::function<void(int64_t, int64_t, double)>& progress = nullptr);

}  // namespace kvs
