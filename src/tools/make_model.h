// Model files made by kvserve itself: random-weight GGUF models of any shape
// (benchmarks, tests, the no-download default) and llama2.c -> GGUF
// conversion. Both go through the GGUF writer, tensor by tensor, so a 1.1B
// model never needs its weights in memory twice.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/quant.h"

namespace kvs {

struct MakeModelOptions {
  std::string out;                 // output .gguf path (required)
  // llama, mistral, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, phi3
  // or gpt-oss: the keys and tensors llama.cpp / ik_llama.cpp expect of each
  // (make_model_arch.h, make_model_moe.h).
  std::string arch = "llama";
  std::string name;                // general.name; default "random-<arch>-<dim>x<layers>" (phi3: "random-phi-...")
  int dim = 64;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 2;
  int ffn_dim = 192;
  int n_vocab = 512;               // default vocab: must be >= 259 (3 specials + 256 bytes)
  int n_ctx = 512;
  float rope_theta = 0.f;          // 0 = the architecture's default (gemma3: 1e6, else 10000)
  float rms_eps = 1e-5f;
  GgmlType type = GgmlType::Q8_0;  // 2-D weights; norms/biases are always F32
  bool tied = false;               // no output.weight: logits use token_embd (gemma: always)
  uint64_t seed = 1;
  // Copy every tokenizer.* key from this GGUF (n_vocab then comes from its
  // token list); empty = built-in byte-level SPM vocabulary of n_vocab pieces.
  std::string vocab_from;
  // With vocab_from a gpt2 (byte-level BPE) vocabulary: write this
  // tokenizer.ggml.pre instead of the copied one (a name pre_type.h knows).
  std::string tokenizer_pre;
  bool progress = true;            // per-tensor progress lines on stderr
  int head_dim = 0;                // attention.key_length; 0 = dim / heads
  int window = -1;                 // sliding window (mistral, gemma2, gemma3, phi3, gpt-oss); -1 = the arch's default
  // RoPE scaling: "" (none), "linear" or "yarn" with factor rope_scale and
  // YaRN's original context rope_orig_ctx (0 = ctx / rope_scale).
  std::string rope_scaling;
  float rope_scale = 0.f;
  int rope_orig_ctx = 0;
  // Per-dimension RoPE factors: llama / mistral write rope_freqs.weight
  // (Llama 3.1's formula), phi3 LongRoPE's rope_factors_long / _short with
  // their attention factor (original context rope_orig_ctx, default ctx / 4).
  bool rope_factors = false;
  float attn_softcap = -1.f;       // gemma2 only; -1 = 50 (Gemma 2's)
  float final_softcap = -1.f;      // gemma2 only; -1 = 30
  // Mixture of experts (tools/make_model_moe.h): llama with n_expert > 0 is
  // Mixtral-style; qwen2moe and qwen3moe always are. 0 = the default.
  int n_expert = 0;                // experts per layer (MoE archs: 8)
  int n_expert_used = 0;           // experts per token (2)
  int expert_ffn = 0;              // qwen2moe / qwen3moe: each expert's width (ffn_dim)
  int shared_ffn = 0;              // qwen2moe: the shared expert's width (ffn_dim)
  // The experts' 3-D tensors' type; unset = gpt-oss: MXFP4 (as its real
  // files are), the others: `type`.
  std::optional<GgmlType> expert_type;
};

// Named shapes: "tiny" (dim 64, 2 layers, 4 heads, 2 KV heads, ffn 192,
// vocab 512, ctx 512: the defaults above) and "1.1b" (dim 2048, 16 layers, 32 heads, 8 KV heads, ffn 8192,
// vocab 32000, ctx 2048: ~1.1B parameters untied). Only shape fields are
// changed; throws std::invalid_argument for unknown names.
void apply_model_preset(const std::string& preset, MakeModelOptions& o);

// Writes a GGUF with seeded random weights: N(0, 0.02)-ish matrices scaled
// by 1/sqrt(fan_in) so activations stay O(1) through the layers, norms = 1.
// Throws std::invalid_argument for bad shapes, ModelError for I/O problems.
void make_random_model(const MakeModelOptions& o);

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k",
// "q5_k", "q6_k" (any case) -> type; throws std::invalid_argument listing them.
GgmlType parse_tensor_type(const std::string& s);

// llama2.c checkpoint (+ its tokenizer) -> GGUF (llama arch, llama.cpp's keys,
// tokenizer.ggml.model "llama"). Loading the result gives the same logits as
// loading the .bin (exactly for F32).
void convert_llama2c(const std::string& bin, const std::string& tok, const std::string& out_gguf,
                     GgmlType type = GgmlType::F32);

}  // namespace kvs
