// The engine API: one forward pass over a batch of sequence chunks, reading
// and writing K/V through block tables. The engine holds no per-request
// state; callers (CLI, scheduler, tests) own sequences and their blocks.
// Not thread-safe: one thread (the engine thread) calls forward().
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace kvs {

class Model;
class ThreadPool;
struct KvStorage;
struct WindowPolicy;

struct EngineOptions {
  int n_threads = 0;  // 0 = one per core
  // Float32 activations against exactly dequantized weights (the reference
  // math; slow). Default: quantized weights use int8 activations in their dot
  // products, as llama.cpp does.
  bool exact = false;
  // The longest sequence this engine runs (tokens; 0 = the model's training
  // context): the peers' context per sequence. LongRoPE models (Phi-3 with
  // rope_factors_long / _short) rotate with the long factors when it exceeds
  // the file's rope.scaling.original_context_length, else the short ones.
  int n_ctx = 0;
};

// One sequence's slice of a batch: tokens at positions pos0 .. pos0+n_tokens-1.
struct SeqChunk {
  const int32_t* block_table = nullptr;  // physical block per logical block, covering [0, pos0 + n_tokens)
  int pos0 = 0;                          // tokens of this sequence already in the cache
  const int32_t* tokens = nullptr;
  int n_tokens = 0;
  bool all_logits = false;  // logits of every token (perplexity) or only of the last
  // Quantized KV cache only: the sequence's full-precision residual
  // ([n_layers, 2, group_tokens, kvdim], KvLayout::residual_floats()): K and V
  // of the tokens of its last, not yet complete group. forward() reads the
  // first pos0 % group_tokens rows and leaves those of the new last group.
  float* residual = nullptr;
  // Which keys each token sees and at which RoPE positions: the sequence's
  // policy in force, resolved against the model's own sliding window and
  // validated once when the sequence starts (WindowPolicy::in_force), owned
  // by the caller like the block table. Null: every key is visible (only for
  // models that declare no window). Entries of block_table for blocks no
  // token of the chunk can see may be -1 (freed).
  const WindowPolicy* window = nullptr;
  // A hybrid KV cache (the storage layout has several KV tables, one per
  // group of layers with one window: kernels/kv_groups.h): the sequence's
  // block table of each table, in table order, each like block_table (whose
  // entries a table's window hides may be -1). Null: block_table is the one
  // table (every cache whose layers share a window).
  const int32_t* const* block_tables = nullptr;
};

// The phases of a forward pass, as the per-op timer splits it
// (Engine::set_op_timing, `kvserve bench --ops`).
enum class OpPhase : int {
  Embed,      // the batch plan, buffers, RoPE tables, token embeddings
  Norm,       // the RMSNorms before attention and before the FFN
  Qkv,        // Q, K, V projections and their biases
  RopeKv,     // QK norms, RoPE, K/V stored into the cache
  Attention,  // attention over the cache
  AttnOut,    // attention output projection and bias
  FfnUp,      // gate and up projections
  FfnAct,     // SwiGLU / GeGLU
  FfnDown,    // down projection
  Moe,        // a mixture-of-experts FFN: routing and experts
  Residual,   // post norms and residual adds
  Output,     // final norm, classifier, logit soft-cap
  kCount
};
constexpr int kOpPhases = int(OpPhase::kCount);
const char* op_phase_name(OpPhase p);  // "embed", "norm", "qkv", ...

// Wall time of each phase, summed over the forwards timed since the last
// reset (all zero while timing is off).
struct OpTimes {
  double seconds[kOpPhases] = {};
  double total() const;
};

struct ForwardStats {
  int64_t tokens = 0;  // tokens that went through the model (for prefix-hit accounting)
  OpTimes ops;         // per-phase wall time (Engine::set_op_timing)
};

class Engine {
 public:
  Engine(std::shared_ptr<const Model> model, const EngineOptions& opts = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const;
  std::shared_ptr<const Model> model_ptr() const;
  ThreadPool& pool();
  int n_threads() const;

  // Writes each token's K/V into its slot and the requested logits rows to
  // `logits` ([n_rows, n_vocab], rows in batch order: all rows of a chunk
  // with all_logits, else one). Positions must fit the chunk's block table.
  void forward(const std::vector<SeqChunk>& batch, const KvStorage& kv, std::vector<float>& logits);
  const ForwardStats& stats() const;
  // Per-op timing: while on, forward adds each phase's wall time (each phase
  // ends at the pool's barrier, so its time is the step's, all threads) to
  // stats().ops. Off by default: it reads the clock once per phase.
  void set_op_timing(bool on);
  void reset_op_times();

 private:
  struct Impl;  // engine.cpp: the model, the thread pool, the step's plan and buffers
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvs
