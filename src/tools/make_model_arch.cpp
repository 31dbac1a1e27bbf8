#include "tools/make_model_arch.h"

#include "tools/make_model_moe.h"

#include <cmath>
#include <numbers>
#include <stdexcept>

namespace kvs {

namespace {

bool is_gemma(const std::string& a) { return a == "gemma2" || a == "gemma3"; }
bool llama_family(const std::string& a) { return a == "llama" || a == "mistral"; }
bool qwen2_attention(const std::string& a) { return a == "qwen2" || a == "qwen2moe"; }
bool qwen3_attention(const std::string& a) { return a == "qwen3" || a == "qwen3moe"; }

void need(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("make-model: " + what);
}

// Defaults of the architecture for what the caller left open.
void fill_defaults(MakeModelOptions& r) {
  const bool gpt_oss = r.arch == "gpt-oss";
  if (r.head_dim == 0 && gpt_oss) r.head_dim = 64;  // gpt-oss's, whatever its width
  if (r.head_dim == 0 && r.n_heads > 0) r.head_dim = r.dim / r.n_heads;
  if (r.rope_theta == 0.f) r.rope_theta = r.arch == "gemma3" ? 1e6f : gpt_oss ? 150000.f : 10000.f;
  if (r.window < 0) {
    if (r.arch == "gemma2" || r.arch == "mistral") r.window = 4096;  // Gemma 2, Mistral 7B v0.1
    else if (r.arch == "gemma3") r.window = 1024;                    // Gemma 3 4B and up
    else if (gpt_oss) r.window = 128;
    else r.window = 0;                                               // phi3: 0 = none (Phi-4 style)
  }
  // gpt-oss's YaRN: factor 32 over an original context of ctx / 32.
  if (gpt_oss && r.rope_scaling.empty()) r.rope_scaling = "yarn", r.rope_scale = 32.f;
  if (r.arch == "gemma2") {
    if (r.attn_softcap < 0.f) r.attn_softcap = 50.f;
    if (r.final_softcap < 0.f) r.final_softcap = 30.f;
  }
  if (is_gemma(r.arch)) r.tied = true;  // Gemma files have no output.weight
  if (r.rope_scaling == "yarn" && r.rope_orig_ctx == 0) r.rope_orig_ctx = std::max(1, int(r.n_ctx / r.rope_scale));
  if (r.rope_factors && r.arch == "phi3" && r.rope_orig_ctx == 0) r.rope_orig_ctx = std::max(1, r.n_ctx / 4);
  if (r.rope_factors && llama_family(r.arch) && r.rope_orig_ctx == 0) r.rope_orig_ctx = std::max(1, r.n_ctx / 4);
}

// Flags the architecture cannot honour, named.
void check_flags(const MakeModelOptions& o, const MakeModelOptions& given) {
  const std::string& a = o.arch;
  need(given.window < 0 || a == "mistral" || is_gemma(a) || a == "phi3" || a == "gpt-oss",
       "--window: " + a + " has no sliding window (mistral, gemma2, gemma3, phi3 and gpt-oss have one)");
  need(!(is_gemma(a) || a == "gpt-oss") || o.window > 0, "--window must be > 0 for " + a);
  need(o.window >= 0, "--window must be >= 0");
  need(!(given.tied && a == "phi3"), "--tied: phi3 files always have output.weight");
  need(a == "gemma2" || (given.attn_softcap < 0.f && given.final_softcap < 0.f),
       "--attn-softcap / --final-softcap: only gemma2 soft-caps logits");
  need(o.attn_softcap < 0.f || o.attn_softcap > 0.f, "--attn-softcap must be > 0");
  need(o.final_softcap < 0.f || o.final_softcap > 0.f, "--final-softcap must be > 0");
  need(a != "phi3" || o.head_dim == o.dim / o.n_heads, "--head-dim: phi3's head dim is dim / heads");
  need(o.head_dim > 0 && o.head_dim % 2 == 0, "--head-dim " + std::to_string(o.head_dim) + " must be even (RoPE pairs)");
  need(!o.rope_factors || llama_family(a) || a == "phi3",
       "--rope-factors: only llama / mistral (rope_freqs) and phi3 (LongRoPE) have per-dimension RoPE factors");
  need(!(o.rope_factors && a == "phi3" && !o.rope_scaling.empty()),
       "--rope-scaling: phi3's LongRoPE factors replace it");
  need(given.rope_orig_ctx == 0 || o.rope_scaling == "yarn" || o.rope_factors,
       "--rope-orig-ctx needs --rope-scaling yarn or --rope-factors");
}

// Llama 3.1's frequency factors (factor 8, low / high frequency factors 1
// and 4) for an original context of orig tokens.
std::vector<float> llama3_factors(int head_dim, float theta, int orig) {
  const float factor = 8.f, low = 1.f, high = 4.f;
  const float low_wavelen = float(orig) / low, high_wavelen = float(orig) / high;
  std::vector<float> f;
  for (int i = 0; i < head_dim / 2; ++i) {
    const float freq = 1.f / std::pow(theta, float(2 * i) / float(head_dim));
    const float wavelen = 2.f * std::numbers::pi_v<float> / freq;
    if (wavelen < high_wavelen) f.push_back(1.f);
    else if (wavelen > low_wavelen) f.push_back(factor);
    else {
      const float smooth = (float(orig) / wavelen - low) / (high - low);
      f.push_back(1.f / ((1.f - smooth) / factor + smooth));
    }
  }
  return f;
}

// LongRoPE's short (mild) and long (strong) factors, smooth over the pairs.
std::vector<float> longrope_factors(int head_dim, bool long_set) {
  std::vector<float> f;
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float x = half > 1 ? float(i) / float(half - 1) : 0.f;
    f.push_back(long_set ? 1.f + 15.f * x * x : 1.f + 0.5f * x);
  }
  return f;
}

// One layer's attention tensors.
void attention_tensors(const MakeModelOptions& o, const std::string& p, const TensorSource& s) {
  const int64_t dim = o.dim, qdim = int64_t(o.n_heads) * o.head_dim, kvdim = int64_t(o.n_kv_heads) * o.head_dim;
  const float s_in = 1.f / std::sqrt(float(dim)), s_branch = 1.f / std::sqrt(2.f * o.n_layers);
  s.norm(p + "attn_norm.weight", dim);
  if (o.arch == "phi3") {
    s.matrix(p + "attn_qkv.weight", qdim + 2 * kvdim, dim, s_in);  // [q + k + v rows, dim]
  } else {
    s.matrix(p + "attn_q.weight", qdim, dim, s_in);   // [n_heads*hd, dim]
    s.matrix(p + "attn_k.weight", kvdim, dim, s_in);  // [n_kv*hd, dim]
    s.matrix(p + "attn_v.weight", kvdim, dim, s_in);  // [n_kv*hd, dim]
  }
  if (qwen2_attention(o.arch) || o.arch == "gpt-oss") {
    s.bias(p + "attn_q.bias", qdim);
    s.bias(p + "attn_k.bias", kvdim);
    s.bias(p + "attn_v.bias", kvdim);
  }
  if (qwen3_attention(o.arch) || o.arch == "gemma3") {
    s.norm(p + "attn_q_norm.weight", o.head_dim);  // [head_dim]
    s.norm(p + "attn_k_norm.weight", o.head_dim);
  }
  s.matrix(p + "attn_output.weight", dim, qdim, s_branch / std::sqrt(float(qdim)));  // [dim, n_heads*hd]
  if (is_gemma(o.arch)) s.norm(p + "post_attention_norm.weight", dim);
  if (o.arch == "gpt-oss") {
    s.bias(p + "attn_output.bias", dim);  // [dim]
    // Learned sink logits [n_heads], spread so that some heads' sinks take a
    // real share of the softmax and others almost none.
    s.tensor(p + "attn_sinks.weight", {o.n_heads}, 2.f, GgmlType::F32);
  }
}

// One layer's FFN tensors (a mixture of experts: make_model_moe.h).
void ffn_tensors(const MakeModelOptions& o, const std::string& p, const TensorSource& s) {
  const int64_t dim = o.dim, ffn = o.ffn_dim;
  const float s_in = 1.f / std::sqrt(float(dim)), s_branch = 1.f / std::sqrt(2.f * o.n_layers);
  // gpt-oss's FFN norm is stored as post_attention_norm (the peer's name).
  s.norm(p + (o.arch == "gpt-oss" ? "post_attention_norm.weight" : "ffn_norm.weight"), dim);
  if (moe_model(o)) return add_moe_ffn(o, p, s_branch, s.tensor);
  if (o.arch == "phi3") {
    s.matrix(p + "ffn_up.weight", 2 * ffn, dim, s_in);  // [2 ffn, dim]: gate rows, then up rows
  } else {
    s.matrix(p + "ffn_gate.weight", ffn, dim, s_in);  // [ffn, dim]
    s.matrix(p + "ffn_up.weight", ffn, dim, s_in);    // [ffn, dim]
  }
  s.matrix(p + "ffn_down.weight", dim, ffn, s_branch / std::sqrt(float(ffn)));  // [dim, ffn]
  if (is_gemma(o.arch)) s.norm(p + "post_ffw_norm.weight", dim);
}

}  // namespace

MakeModelOptions resolve_arch_options(const MakeModelOptions& given) {
  static const char* kArchs[] = {"llama",  "mistral", "qwen2", "qwen2moe", "qwen3",
                                 "qwen3moe", "gemma2", "gemma3", "phi3",     "gpt-oss"};
  bool known = false;
  for (const char* a : kArchs) known |= given.arch == a;
  need(known, "unsupported arch '" + given.arch +
                  "' (supported: llama, mistral, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss)");
  need(given.dim > 0 && given.n_layers > 0 && given.n_heads > 0 && given.n_kv_heads > 0 && given.ffn_dim > 0 &&
           given.n_ctx > 0,
       "dim, layers, heads, kv-heads, ffn and ctx must be positive");
  need(given.head_dim != 0 || given.dim % given.n_heads == 0,
       "dim " + std::to_string(given.dim) + " is not a multiple of heads " + std::to_string(given.n_heads) +
           " (give --head-dim)");
  need(given.n_heads % given.n_kv_heads == 0, "kv-heads " + std::to_string(given.n_kv_heads) +
                                                  " does not divide heads " + std::to_string(given.n_heads));
  need(given.head_dim >= 0, "--head-dim must be > 0");
  need(given.rope_theta == 0.f || given.rope_theta > 1.f, "rope theta must be > 1");
  need(given.rms_eps > 0.f, "rms eps must be > 0");
  need(given.rope_scaling.empty() || given.rope_scaling == "linear" || given.rope_scaling == "yarn",
       "--rope-scaling '" + given.rope_scaling + "' is not one of linear, yarn");
  need(given.rope_scaling.empty() == (given.rope_scale == 0.f), "--rope-scale and --rope-scaling go together");
  need(given.rope_scale == 0.f || given.rope_scale >= 1.f, "--rope-scale must be >= 1");
  need(given.rope_orig_ctx >= 0, "--rope-orig-ctx must be > 0");
  MakeModelOptions r = given;
  fill_defaults(r);
  check_flags(r, given);
  return moe_defaults(r);
}

void write_arch_keys(GgufWriter& w, const MakeModelOptions& o, const std::string&) {
  const std::string a = o.arch + ".";
  if (o.head_dim != o.dim / o.n_heads || is_gemma(o.arch) || qwen3_attention(o.arch) || o.arch == "gpt-oss") {
    w.set_u32(a + "attention.key_length", uint32_t(o.head_dim));
    w.set_u32(a + "attention.value_length", uint32_t(o.head_dim));
  }
  if (o.arch == "mistral" || is_gemma(o.arch) || o.arch == "phi3" || o.arch == "gpt-oss")
    w.set_u32(a + "attention.sliding_window", uint32_t(o.window));
  if (o.arch == "gemma2") {
    w.set_f32(a + "attn_logit_softcapping", o.attn_softcap);
    w.set_f32(a + "final_logit_softcapping", o.final_softcap);
  }
  if (!o.rope_scaling.empty()) {
    w.set_str(a + "rope.scaling.type", o.rope_scaling);
    w.set_f32(a + "rope.scaling.factor", o.rope_scale);
    if (o.rope_scaling == "yarn") w.set_u32(a + "rope.scaling.original_context_length", uint32_t(o.rope_orig_ctx));
  }
  if (o.rope_factors && o.arch == "phi3") {
    // The converter's attention factor for LongRoPE.
    const double scale = double(o.n_ctx) / o.rope_orig_ctx;
    const double f = scale > 1.0 ? std::sqrt(1.0 + std::log(scale) / std::log(double(o.rope_orig_ctx))) : 1.0;
    w.set_f32(a + "rope.scaling.attn_factor", float(f));
    w.set_u32(a + "rope.scaling.original_context_length", uint32_t(o.rope_orig_ctx));
  }
}

void write_arch_tensors(const MakeModelOptions& o, int n_vocab, const TensorSource& s) {
  const float s_in = 1.f / std::sqrt(float(o.dim));
  s.matrix("token_embd.weight", n_vocab, o.dim, s_in);  // [n_vocab, dim]
  s.norm("output_norm.weight", o.dim);                   // [dim]
  if (!o.tied) s.matrix("output.weight", n_vocab, o.dim, s_in);  // [n_vocab, dim]
  if (o.rope_factors && llama_family(o.arch))
    s.values("rope_freqs.weight", llama3_factors(o.head_dim, o.rope_theta, o.rope_orig_ctx));  // [head_dim/2]
  if (o.rope_factors && o.arch == "phi3") {
    s.values("rope_factors_long.weight", longrope_factors(o.head_dim, true));    // [head_dim/2]
    s.values("rope_factors_short.weight", longrope_factors(o.head_dim, false));  // [head_dim/2]
  }
  for (int l = 0; l < o.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    attention_tensors(o, p, s);
    ffn_tensors(o, p, s);
  }
}

}  // namespace kvs
