#include "model/arch.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "model/meta.h"

namespace kvs {

namespace {

ArchInfo llama_like(std::string_view name) {
  ArchInfo a;
  a.name = name;
  a.qkv_bias = true;
  a.rope_freqs = true;
  a.rope_long_short = true;
  a.moe = ArchInfo::Moe::Optional;  // Mixtral-style
  a.moe_norm_weights = true;
  return a;
}

ArchInfo make_qwen2() {
  ArchInfo a;
  a.name = "qwen2";
  a.rope = RopeStyle::Neox;
  a.qkv_bias = true;
  return a;
}

ArchInfo make_qwen2moe() {
  ArchInfo a = make_qwen2();
  a.name = "qwen2moe";
  a.output_required = true;
  a.moe = ArchInfo::Moe::Always;
  a.moe_shared = true;
  return a;
}

ArchInfo make_qwen3() {
  ArchInfo a;
  a.name = "qwen3";
  a.rope = RopeStyle::Neox;
  a.qk_norm = true;
  return a;
}

ArchInfo make_qwen3moe() {
  ArchInfo a = make_qwen3();
  a.name = "qwen3moe";
  a.moe = ArchInfo::Moe::Always;
  a.moe_norm_weights = true;
  return a;
}

ArchInfo make_gemma(std::string_view name, bool qk_norm) {
  ArchInfo a;
  a.name = name;
  a.rope = RopeStyle::Neox;
  a.act = FfnAct::GeluTanh;
  a.post_norms = true;
  a.embd_scaled = true;
  a.qk_norm = qk_norm;
  return a;
}

ArchInfo make_phi3() {
  ArchInfo a;
  a.name = "phi3";
  a.rope = RopeStyle::Neox;
  a.output_required = true;
  a.fused_qkv = true;
  a.fused_gate_up = true;
  a.head_dim_fixed = true;
  a.rope_long_short = true;
  return a;
}

// ik_llama.cpp's LLM_ARCH_OPENAI_MOE (graph openai-moe-iswa).
ArchInfo make_gpt_oss() {
  ArchInfo a;
  a.name = "gpt-oss";
  a.rope = RopeStyle::Neox;
  a.output_required = true;
  a.qkv_bias = true;
  a.moe = ArchInfo::Moe::Always;
  a.gpt_oss = true;
  return a;
}

const std::array<ArchInfo, 10>& table() {
  static const std::array<ArchInfo, 10> t = {llama_like("llama"),      llama_like("mistral"),       make_qwen2(),
                                             make_qwen3(),             make_gemma("gemma2", false), make_gemma("gemma3", true),
                                             make_phi3(),              make_qwen2moe(),             make_qwen3moe(),
                                             make_gpt_oss()};
  return t;
}

// Phi-3's window as the peers take it: the key, else the defaults they keep
// for files written before it existed; a file with neither is refused.
int phi3_window(const GgufFile& f, const ModelConfig& c) {
  const std::string key = c.arch + ".attention.sliding_window";
  int w = 0;
  if ((c.n_layers == 32 || c.n_layers == 40) && c.n_ctx_train == 4096) w = 2047;
  else if (c.n_layers == 32 && c.n_kv_heads == 32 && c.n_ctx_train == 131072) w = 262144;
  else if (c.n_layers == 40 && c.n_ctx_train == 131072) w = 131072;
  if (f.find(key)) return detail::meta_int(f, key, std::nullopt, 0, 1 << 30);
  if (w == 0) throw ModelError(f.path() + ": required key '" + key + "' is missing (0 = no sliding window)");
  return w;
}

// Gemma's query scale: 1 / sqrt(key_length), except the 27B shape (by its
// layer count, as the peers tell it), which scales by 1 / sqrt(dim / heads).
float gemma_query_scale(const GgufFile& f, const ModelConfig& c, int layers_27b) {
  const int d = c.n_layers == layers_27b ? c.dim / c.n_heads : c.head_dim;
  if (d < 1)
    throw ModelError(f.path() + ": key '" + c.arch + ".embedding_length' = " + std::to_string(c.dim) +
                     " is smaller than head_count (no query scale)");
  return 1.0f / std::sqrt(float(d));
}

}  // namespace

const ArchInfo* find_arch(std::string_view name) {
  for (const ArchInfo& a : table())
    if (a.name == name) return &a;
  return nullptr;
}

std::string supported_archs() {
  std::string s;
  for (const ArchInfo& a : table()) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

void apply_arch(const GgufFile& f, const ArchInfo& a, ModelConfig& c) {
  const std::string p = c.arch + ".";
  c.rope = a.rope;
  c.ffn_act = a.act;
  c.qk_norm = a.qk_norm;
  c.post_norms = a.post_norms;
  c.fused_qkv = a.fused_qkv;
  c.fused_gate_up = a.fused_gate_up;
  if (a.embd_scaled) c.embd_scale = std::sqrt(float(c.dim));
  c.layer_window.assign(size_t(c.n_layers), 0);
  c.layer_rope.assign(size_t(c.n_layers), 0);
  const std::string wkey = p + "attention.sliding_window";
  if (a.name == "gemma2") {
    // Even layers: a window (4096 when the key is absent); odd layers: global.
    const int w = detail::meta_int(f, wkey, 4096, 1, 1 << 30);
    for (int l = 0; l < c.n_layers; l += 2) c.layer_window[size_t(l)] = w;
    c.attn_scale = gemma_query_scale(f, c, 46);
    c.attn_softcap = detail::meta_float(f, p + "attn_logit_softcapping", 50.f, 0, 1e30);
    c.final_softcap = detail::meta_float(f, p + "final_logit_softcapping", 30.f, 0, 1e30);
  } else if (a.name == "gemma3") {
    // Five local layers, then a global one; the local ones rotate with base
    // 10000, unscaled; the global ones with the file's base and scaling.
    const int w = detail::meta_int(f, wkey, std::nullopt, 1, 1 << 30);
    RopeConfig local = c.ropes[0];
    local.theta = 10000.f;
    local.freq_scale = 1.f;
    c.ropes.push_back(local);
    for (int l = 0; l < c.n_layers; ++l)
      if ((l + 1) % 6 != 0) c.layer_window[size_t(l)] = w, c.layer_rope[size_t(l)] = 1;
    c.attn_scale = gemma_query_scale(f, c, 62);
  } else if (a.gpt_oss) {
    // Even layers: a window (the key is required, as the peer reads it); odd layers: global.
    const int w = detail::meta_int(f, wkey, std::nullopt, 1, 1 << 30);
    for (int l = 0; l < c.n_layers; l += 2) c.layer_window[size_t(l)] = w;
    c.attn_scale = 1.0f / std::sqrt(float(c.n_rot));
    c.attn_sinks = true;
    c.attn_out_bias = true;
  } else {
    const int w = a.name == "phi3" ? phi3_window(f, c) : detail::meta_int(f, wkey, 0, 0, 1 << 30);
    c.layer_window.assign(size_t(c.n_layers), w);
  }
  // The model-wide window: the one every layer has, if they all have it.
  const int w0 = c.layer_window.empty() ? 0 : c.layer_window[0];
  const bool all = std::all_of(c.layer_window.begin(), c.layer_window.end(), [&](int w) { return w == w0; });
  c.sliding_window = all ? w0 : 0;
}

}  // namespace kvs
