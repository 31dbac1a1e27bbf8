// A loaded model: configuration, immutable weight views and the vocabulary.
// Built from a GGUF file (mmapped; weights stay in the mapping) or from a
// llama2.c checkpoint (weights copied into owned float buffers).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "kernels/weight_pack.h"
#include "model/gguf.h"
#include "tokenizer/vocab.h"

namespace kvs {

enum class RopeStyle { Normal, Neox };  // Normal: pairs (2i, 2i+1); Neox: (i, i + n_rot/2)
// The FFN's gate activation: SwiGLU (silu(gate) * up) or GeGLU with the
// tanh-approximated GELU (Gemma).
enum class FfnAct { Silu, GeluTanh };
// Which per-dimension RoPE frequency factors the file has: none, one set
// (Llama 3.1+ rope_freqs.weight), or LongRoPE's pair (Phi-3
// rope_factors_long / rope_factors_short, chosen by the context length).
enum class RopeFactors { None, Freqs, LongShort };

// How a mixture-of-experts layer turns router logits into k expert weights.
enum class MoeGating : uint8_t {
  SoftmaxTopK,  // softmax over all experts, then the k largest (Mixtral, Qwen MoE)
  TopKSoftmax,  // the k largest logits, then softmax over those k (gpt-oss)
};
// The experts' gated activation: act(gate) * up.
enum class MoeActivation : uint8_t {
  SwiGLU,         // silu(gate) * up
  SwiGLUClamped,  // gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit): g * sigmoid(alpha g) * (u + 1)
};

// The most experts a layer may have (the loader refuses more; routing keeps
// a bit per expert on the stack).
constexpr int kMaxExperts = 1024;

// Mixture-of-experts FFN shape and routing (n_expert == 0: a dense FFN).
struct MoeConfig {
  int n_expert = 0;         // experts per layer
  int n_used = 0;           // experts each token runs (top-k)
  int ffn_dim = 0;          // each expert's hidden width
  int shared_ffn_dim = 0;   // the shared expert's hidden width; 0 = none
  MoeGating gating = MoeGating::SoftmaxTopK;
  bool norm_weights = false;  // rescale the k chosen weights to sum 1 (SoftmaxTopK only)
  MoeActivation act = MoeActivation::SwiGLU;
  float clamp_alpha = 1.702f, clamp_limit = 7.0f;  // SwiGLUClamped's constants
};

// What the forward computes, from the file's metadata. The architecture's
// differences are data here (flags, per-layer facts) and optional tensors in
// LayerWeights; the forward has no per-architecture branches.
struct ModelConfig {
  std::string arch;        // "llama", "mistral", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "gpt-oss"
  std::string name;        // general.name or file stem
  int n_vocab = 0;
  int dim = 0;             // embedding width
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;        // dim / n_heads unless metadata says otherwise
  int ffn_dim = 0;
  int n_ctx_train = 0;     // context length from metadata
  int n_rot = 0;           // rotary dimensions (<= head_dim)
  float rope_theta = 10000.f;  // ropes[0].theta
  float rms_eps = 1e-5f;
  RopeStyle rope = RopeStyle::Normal;
  bool has_qkv_bias = false;
  bool tied_output = false;
  // The window every layer shares, applied per sequence through its
  // WindowPolicy (Mistral-style native window, Phi-3's sliding_window; the
  // KV blocks outside it are freed); 0 when some layer sees the whole context.
  int sliding_window = 0;

  // Per layer (each vector has n_layers entries):
  // layer_window[l] = 0: layer l's queries see every key the sequence's
  //   WindowPolicy shows them. W > 0: a sliding window on top of that: the
  //   query at text index p sees key k only if p - k < W, i.e. keys
  //   p - W + 1 .. p (the peers' SWA mask). Gemma 2: even layers; Gemma 3:
  //   all but every sixth; Mistral / Phi-3: every layer (= sliding_window).
  std::vector<int> layer_window;
  // layer_rope[l]: the entry of `ropes` whose frequencies layer l rotates
  // with. ropes[0] is the model's RoPE (rope.freq_base, rope.scaling.*);
  // Gemma 3's local (windowed) layers use ropes[1] (base 10000, unscaled).
  std::vector<int> layer_rope;
  std::vector<RopeConfig> ropes;
  RopeFactors rope_factors = RopeFactors::None;
  // LongRoPE: the long factors are used when the engine's context exceeds
  // this (rope.scaling.original_context_length), as the peers choose.
  int n_ctx_orig = 0;

  float attn_scale = 0.f;     // query scale; 0 = 1 / sqrt(head_dim)
  float attn_softcap = 0.f;   // > 0: scores = cap * tanh(scores / cap) (Gemma 2)
  float final_softcap = 0.f;  // > 0: logits = cap * tanh(logits / cap) (Gemma 2)
  float embd_scale = 0.f;     // > 0: embeddings times this (Gemma: sqrt(dim)); 0 = unscaled
  FfnAct ffn_act = FfnAct::Silu;
  bool qk_norm = false;       // per-head RMSNorm of q and k before RoPE (Qwen 3, Gemma 3)
  bool post_norms = false;    // RMSNorm of attention and FFN outputs before the residual add (Gemma 2, 3)
  bool fused_qkv = false;     // attn_qkv holds q, k, v (Phi-3); split into views at load
  bool fused_gate_up = false; // ffn_up holds gate then up (Phi-3); split into views at load
  // gpt-oss: each head's softmax has a learned sink logit (attn_sinks, one
  // per head: an extra term with no value, not a kept token; docs/KV.md),
  // and the attention output has a bias.
  bool attn_sinks = false;
  bool attn_out_bias = false;
  MoeConfig moe;              // n_expert > 0: every layer's FFN is a mixture of experts
  // Fixed bytes of the weights as stored (for planning / rooflines).
  size_t weight_bytes = 0;
};

// One layer's experts. Each expert is a contiguous slice of the file's 3-D
// tensors (ffn_gate_exps / ffn_up_exps [n_expert, ffn_exp, dim],
// ffn_down_exps [n_expert, dim, ffn_exp]), viewed as its own matrix so it is
// repacked and multiplied like a dense one.
struct MoeWeights {
  WeightView router;                      // ffn_gate_inp: [n_expert, dim]
  const float* router_bias = nullptr;     // [n_expert] or null
  std::vector<WeightView> gate, up, down; // per expert: [ffn_exp, dim], [ffn_exp, dim], [dim, ffn_exp]
  const float* gate_bias = nullptr;       // [n_expert, ffn_exp] or null (gpt-oss has all three)
  const float* up_bias = nullptr;         // [n_expert, ffn_exp] or null
  const float* down_bias = nullptr;       // [n_expert, dim] or null
  // Shared expert, run by every token (qwen2moe): sh_gate.data == nullptr when absent.
  WeightView sh_gate, sh_up, sh_down;     // [shared_ffn, dim], [shared_ffn, dim], [dim, shared_ffn]
  const float* sh_gate_inp = nullptr;     // [dim]: the shared expert's weight is sigmoid(x · sh_gate_inp); null = 1
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  WeightView wq, wk, wv, wo;         // wq: [n_heads*head_dim, dim]; wk/wv: [n_kv*head_dim, dim]; wo: [dim, n_heads*head_dim]
  const float* bo = nullptr;         // [dim] attention output bias (gpt-oss) or null
  const float* attn_sinks = nullptr; // [n_heads] learned sink logits (gpt-oss) or null
  const float* bq = nullptr;         // [n_heads*head_dim] (qwen2) or null
  const float* bk = nullptr;         // [n_kv*head_dim]
  const float* bv = nullptr;         // [n_kv*head_dim]
  const float* q_norm = nullptr;     // [head_dim] per-head RMSNorm of q (qk_norm) or null
  const float* k_norm = nullptr;     // [head_dim] per-head RMSNorm of k (qk_norm) or null
  const float* attn_post_norm = nullptr;  // [dim] (post_norms) or null
  const float* ffn_norm = nullptr;   // [dim]
  WeightView w_gate, w_up, w_down;   // gate/up: [ffn, dim]; down: [dim, ffn] (dense FFN)
  MoeWeights moe;                    // mixture-of-experts FFN (ModelConfig::moe.n_expert > 0)
  const float* ffn_post_norm = nullptr;   // [dim] (post_norms) or null
};

struct ModelWeights {
  WeightView tok_embd;               // [n_vocab, dim]
  std::vector<LayerWeights> layers;
  const float* output_norm = nullptr;  // [dim]
  WeightView output;                 // [n_vocab, dim] (== tok_embd when tied)
  const float* rope_freqs = nullptr;   // [n_rot/2] RopeFactors::Freqs, else null
  const float* rope_long = nullptr;    // [n_rot/2] RopeFactors::LongShort, else null
  const float* rope_short = nullptr;   // [n_rot/2]
  // The frequency factors a model runs with when its engine serves
  // sequences of up to n_ctx tokens (0 = the training context): rope_freqs,
  // or LongRoPE's long factors when n_ctx > n_ctx_orig (else the short
  // ones), as llama.cpp chooses; null when the file has none.
  const float* rope_factors_for(const ModelConfig& c, int n_ctx) const;
};

class Model {
 public:
  // Loads by extension/magic: GGUF, or llama2.c .bin (then `tokenizer_path`
  // names the llama2.c tokenizer file; empty = tok512.bin/tokenizer.bin next to it).
  // `on_repack(done, total)`: called as each matrix's load-time copy
  // completes (any thread; a progress hook). `precision`: how products with
  // float weights run (kernels/matmul.h); Bf16 throws std::invalid_argument
  // where AMX-BF16 is not usable or the load-time copy is off.
  static std::shared_ptr<const Model> load(const std::string& path, const std::string& tokenizer_path = "",
                                           const std::function<void(int64_t, int64_t)>& on_repack = nullptr,
                                           MatmulPrecision precision = MatmulPrecision::Fp32);
  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  const Vocab& vocab() const { return vocab_; }
  const std::string& path() const { return path_; }
  // Stable identity of the weights (sha256 of config + file size + path) for
  // prefix-cache scoping.
  const std::string& identity() const { return identity_; }
  // Bf16 when loaded with MatmulPrecision::Bf16: its float matrices run
  // on AMX-BF16 tiles (bf16_matmuls()), and so does its attention where
  // head_dim is a multiple of 16; the identity then differs from the fp32
  // load's. Fp32 otherwise.
  MatmulPrecision precision() const { return precision_; }
  // Some float matrix runs on the AMX-BF16 tiles (quantized ones never do).
  bool bf16_matmuls() const { return bf16_matmuls_; }
  // Its attention runs on the AMX-BF16 tiles (Bf16, head_dim a multiple of 16).
  bool bf16_attention() const;
  // Internal: filled by loaders.
  ModelConfig cfg_;
  ModelWeights w_;
  Vocab vocab_;
  std::string path_, identity_;
  MatmulPrecision precision_ = MatmulPrecision::Fp32;
  bool bf16_matmuls_ = false;
  std::unique_ptr<GgufFile> gguf_;             // keeps the mapping alive
  PackedArena packed_;                         // load-time Panel16 copies (kernels/weight_pack.h)
  std::vector<std::vector<float>> owned_f32_;  // llama2.c weights, biases made f32, etc.
};

}  // namespace kvs

namespace kvs {
// Reads the architecture metadata only (no weights touched): used by
// `kvserve plan` and by Model::load. Throws ModelError for unknown
// architectures or missing keys, naming the key.
ModelConfig config_from_gguf(const GgufFile& f);
}  // namespace kvs
