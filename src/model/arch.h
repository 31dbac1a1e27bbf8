// The architectures kvserve runs, as data: which tensors each one's GGUF
// files hold and what its keys mean, as llama.cpp (b4748) and ik_llama.cpp
// read them (src/llama-model.cpp / llama-hparams.cpp, llama-load-tensors.cpp
// and their graph builders). config_from_gguf and the loader consult this
// table; the forward only sees the ModelConfig it produces.
#pragma once
#include <string>
#include <string_view>

#include "model/gguf.h"
#include "model/model.h"

namespace kvs {

struct ArchInfo {
  std::string_view name;
  RopeStyle rope = RopeStyle::Normal;
  FfnAct act = FfnAct::Silu;
  // output.weight: may be absent (tied to token_embd) or must be present.
  bool output_required = false;
  // q/k/v biases are taken when the file has them (llama family, qwen2).
  bool qkv_bias = false;
  bool qk_norm = false;        // attn_q_norm / attn_k_norm [head_dim]
  bool post_norms = false;     // post_attention_norm / post_ffw_norm [dim]
  bool embd_scaled = false;    // embeddings times sqrt(dim)
  bool fused_qkv = false;      // attn_qkv [q + k + v rows, dim]
  bool fused_gate_up = false;  // ffn_up [2 ffn, dim]: gate rows, then up rows
  bool head_dim_fixed = false; // key_length must be dim / heads (the peers' tensor shapes assume it)
  bool rope_freqs = false;     // rope_freqs.weight may be present (Llama 3.1+)
  bool rope_long_short = false;  // rope_factors_long / _short may be present (LongRoPE)
  // Mixture-of-experts FFNs (moe_gguf.cpp): never, when the file has
  // blk.N.ffn_gate_inp (Mixtral-style llama), or always (feed_forward_length
  // then optional); whether the top k's weights are renormalised to sum 1;
  // whether a shared expert runs beside them (qwen2moe).
  enum class Moe { None, Optional, Always } moe = Moe::None;
  bool moe_norm_weights = false;
  bool moe_shared = false;
  // gpt-oss: q/k/v and output biases required, learned attention sinks
  // (attn_sinks [n_heads]), the FFN's norm stored as post_attention_norm,
  // top-k-then-softmax routing with a router bias, experts with biases and
  // the clamped SwiGLU, a window on even layers, query scale 1 / sqrt(n_rot).
  bool gpt_oss = false;
};

// The entry for `name`, or null.
const ArchInfo* find_arch(std::string_view name);
// "llama, mistral, ..." for messages.
std::string supported_archs();

// The per-architecture facts of `c` that depend on keys beyond the common
// ones: per-layer windows (and the model-wide sliding_window), RoPE kinds per
// layer, the query scale, soft-capping, the embedding scale. `c` already
// holds the common keys (shapes, rope.* of ropes[0]). Throws ModelError
// naming the key.
void apply_arch(const GgufFile& f, const ArchInfo& a, ModelConfig& c);

}  // namespace kvs
