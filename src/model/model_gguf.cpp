// GGUF -> ModelConfig (metadata only) and GGUF -> Model (weight views into
// the mapping). Every tensor's presence, shape and type is checked here so
// the engine can use the views without further checks, and every tensor of
// the file must be one the architecture uses: a tensor kvserve would ignore
// is a refusal naming it, never silently different output.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "model/arch.h"
#include "model/loaders.h"
#include "model/meta.h"
#include "model/tensor_loader.h"
#include "model/vocab_loaders.h"

namespace kvs {

using detail::meta_float;
using detail::meta_int;
using detail::TensorLoader;

namespace {

// RoPE of the model (ropes[0]): base, scaling type and factor, YaRN's
// original context, the attention factor. Unknown scaling types are refused.
RopeConfig rope_from_gguf(const GgufFile& f, const std::string& a, ModelConfig& c) {
  RopeConfig r;
  r.theta = static_cast<float>(f.opt_f64(a + "rope.freq_base").value_or(10000.0));
  if (!(r.theta > 1.f))
    throw ModelError(f.path() + ": key '" + a + "rope.freq_base' = " + std::to_string(r.theta) + " must be > 1");
  const std::string type = f.opt_str(a + "rope.scaling.type").value_or("linear");
  if (type != "none" && type != "linear" && type != "yarn" && type != "longrope")
    throw ModelError(f.path() + ": key '" + a + "rope.scaling.type' = '" + type +
                     "' is not supported (supported: none, linear, yarn, longrope)");
  // The factor, under its current or its old name; 0 or absent = unscaled.
  const std::string fkey = a + (f.find(a + "rope.scaling.factor") ? "rope.scaling.factor" : "rope.scale_linear");
  const float factor = static_cast<float>(f.opt_f64(fkey).value_or(0.0));
  if (!(factor >= 0.f && factor < 1e30f))
    throw ModelError(f.path() + ": key '" + fkey + "' = " + std::to_string(factor) + " must be >= 0");
  if (type != "none" && factor != 0.f) r.freq_scale = 1.f / factor;
  if (type == "yarn") r.ext_factor = 1.f;
  r.attn_factor = meta_float(f, a + "rope.scaling.attn_factor", 1.f, 0, 1e30);
  c.n_ctx_orig = meta_int(f, a + "rope.scaling.original_context_length", c.n_ctx_train, 1, 1 << 30);
  r.n_ctx_orig = c.n_ctx_orig;
  return r;
}

// Heads, head size (key_length), FFN width, context, rotary dimensions, epsilon.
void shape_from_gguf(const GgufFile& f, const std::string& a, const ArchInfo& info, ModelConfig& c) {
  constexpr int64_t kBig = 1 << 20;  // far above any real width; rejects garbage early
  c.dim = meta_int(f, a + "embedding_length", std::nullopt, 1, kBig);
  c.n_layers = meta_int(f, a + "block_count", std::nullopt, 1, 4096);
  c.n_heads = meta_int(f, a + "attention.head_count", std::nullopt, 1, 4096);
  c.n_kv_heads = meta_int(f, a + "attention.head_count_kv", c.n_heads, 1, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    throw ModelError(f.path() + ": key '" + a + "attention.head_count_kv' = " + std::to_string(c.n_kv_heads) +
                     " does not divide head_count " + std::to_string(c.n_heads));
  const bool has_key_length = f.find(a + "attention.key_length") != nullptr;
  if ((!has_key_length || info.head_dim_fixed) && c.dim % c.n_heads != 0)
    throw ModelError(f.path() + ": embedding_length " + std::to_string(c.dim) + " is not a multiple of head_count " +
                     std::to_string(c.n_heads) + " and '" + a + "attention.key_length' is missing");
  c.head_dim = meta_int(f, a + "attention.key_length", c.dim / c.n_heads, 1, 4096);
  if (info.head_dim_fixed && c.head_dim != c.dim / c.n_heads)
    throw ModelError(f.path() + ": key '" + a + "attention.key_length' = " + std::to_string(c.head_dim) +
                     " differs from embedding_length / head_count (" + c.arch + " requires it)");
  const int value_length = meta_int(f, a + "attention.value_length", c.head_dim, 1, 4096);
  if (value_length != c.head_dim)
    throw ModelError(f.path() + ": key '" + a + "attention.value_length' = " + std::to_string(value_length) +
                     " differs from key_length " + std::to_string(c.head_dim) + " (not supported)");
  // Architectures whose every FFN is a mixture of experts may give only the experts' widths.
  const bool moe_only = info.moe == ArchInfo::Moe::Always;
  c.ffn_dim = meta_int(f, a + "feed_forward_length", moe_only ? std::optional<int>(0) : std::nullopt, moe_only ? 0 : 1,
                       16 * kBig);
  c.n_ctx_train = meta_int(f, a + "context_length", std::nullopt, 1, 1 << 30);
  c.n_rot = meta_int(f, a + "rope.dimension_count", c.head_dim, 2, c.head_dim);
  if (c.n_rot % 2 != 0)
    throw ModelError(f.path() + ": key '" + a + "rope.dimension_count' = " + std::to_string(c.n_rot) + " is odd");
  c.rms_eps = static_cast<float>(f.opt_f64(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(c.rms_eps > 0.f && c.rms_eps < 1.f))
    throw ModelError(f.path() + ": key '" + a + "attention.layer_norm_rms_epsilon' = " + std::to_string(c.rms_eps) +
                     " is not in (0, 1)");
}

// Vocabulary size: the token list is authoritative, then the optional
// vocab_size key, then the embedding table's shape.
int vocab_size(const GgufFile& f, const std::string& a) {
  int n = 0;
  if (const GgufValue* toks = f.find("tokenizer.ggml.tokens")) {
    if (!toks->is_array()) throw ModelError(f.path() + ": key 'tokenizer.ggml.tokens' is not an array");
    n = static_cast<int>(std::min<size_t>(toks->as_arr().size(), 1u << 30));
  } else if (f.find(a + "vocab_size")) {
    n = meta_int(f, a + "vocab_size", std::nullopt, 1, 1 << 30);
  } else if (const GgufTensorInfo* e = f.find_tensor("token_embd.weight"); e && e->dims.size() == 2) {
    n = static_cast<int>(std::min<int64_t>(e->dims[1], 1 << 30));
  } else {
    throw ModelError(f.path() + ": cannot tell the vocabulary size: key 'tokenizer.ggml.tokens' is missing");
  }
  if (n <= 0) throw ModelError(f.path() + ": key 'tokenizer.ggml.tokens' is empty");
  return n;
}

// One layer's attention weights: q/k/v (separate or fused), biases, QK norms.
void load_attention(TensorLoader& t, const ModelConfig& c, const std::string& p, LayerWeights& L) {
  const int64_t dim = c.dim, qdim = int64_t(c.n_heads) * c.head_dim, kvdim = int64_t(c.n_kv_heads) * c.head_dim;
  L.attn_norm = t.vector(p + "attn_norm.weight", dim);  // [dim]
  if (c.fused_qkv) {
    const WeightView qkv = t.matrix(p + "attn_qkv.weight", qdim + 2 * kvdim, dim);  // [q + k + v rows, dim]
    L.wq = TensorLoader::rows(qkv, 0, qdim);
    L.wk = TensorLoader::rows(qkv, qdim, kvdim);
    L.wv = TensorLoader::rows(qkv, qdim + kvdim, kvdim);
  } else {
    L.wq = t.matrix(p + "attn_q.weight", qdim, dim);   // [n_heads*hd, dim]
    L.wk = t.matrix(p + "attn_k.weight", kvdim, dim);  // [n_kv*hd, dim]
    L.wv = t.matrix(p + "attn_v.weight", kvdim, dim);  // [n_kv*hd, dim]
  }
  L.wo = t.matrix(p + "attn_output.weight", dim, qdim);  // [dim, n_heads*hd]
  if (c.has_qkv_bias) {
    L.bq = t.vector(p + "attn_q.bias", qdim);   // [n_heads*hd]
    L.bk = t.vector(p + "attn_k.bias", kvdim);  // [n_kv*hd]
    L.bv = t.vector(p + "attn_v.bias", kvdim);  // [n_kv*hd]
  }
  if (c.qk_norm) {
    L.q_norm = t.vector(p + "attn_q_norm.weight", c.head_dim);  // [head_dim]
    L.k_norm = t.vector(p + "attn_k_norm.weight", c.head_dim);  // [head_dim]
  }
  if (c.post_norms) L.attn_post_norm = t.vector(p + "post_attention_norm.weight", dim);  // [dim]
  if (c.attn_out_bias) L.bo = t.vector(p + "attn_output.bias", dim);                  // [dim]
  if (c.attn_sinks) L.attn_sinks = t.vector(p + "attn_sinks.weight", c.n_heads);      // [n_heads]
}

// One layer's FFN weights: gate/up (separate or fused), down, norms; or its
// mixture of experts.
void load_ffn(TensorLoader& t, const ModelConfig& c, const std::string& p, LayerWeights& L) {
  const int64_t dim = c.dim, ffn = c.ffn_dim;
  // gpt-oss stores the FFN's (pre-)norm under the name post_attention_norm.
  L.ffn_norm = t.vector(p + (c.arch == "gpt-oss" ? "post_attention_norm.weight" : "ffn_norm.weight"), dim);  // [dim]
  if (c.moe.n_expert > 0) {
    detail::load_moe_layer(t, c, p, L.moe);
  } else {
    if (c.fused_gate_up) {
      const WeightView gu = t.matrix(p + "ffn_up.weight", 2 * ffn, dim);  // [2 ffn, dim]: gate rows, then up rows
      L.w_gate = TensorLoader::rows(gu, 0, ffn);
      L.w_up = TensorLoader::rows(gu, ffn, ffn);
    } else {
      L.w_gate = t.matrix(p + "ffn_gate.weight", ffn, dim);  // [ffn, dim]
      L.w_up = t.matrix(p + "ffn_up.weight", ffn, dim);      // [ffn, dim]
    }
    L.w_down = t.matrix(p + "ffn_down.weight", dim, ffn);  // [dim, ffn]
  }
  if (c.post_norms) L.ffn_post_norm = t.vector(p + "post_ffw_norm.weight", dim);  // [dim]
}

}  // namespace

ModelConfig config_from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch = f.get_str("general.architecture");
  const ArchInfo* info = find_arch(c.arch);
  if (!info)
    throw ModelError(f.path() + ": unsupported architecture '" + c.arch + "' (key 'general.architecture'; supported: " +
                     supported_archs() + ")");
  const std::string a = c.arch + ".";
  c.name = f.opt_str("general.name").value_or(std::filesystem::path(f.path()).stem().string());
  shape_from_gguf(f, a, *info, c);
  c.ropes = {rope_from_gguf(f, a, c)};
  c.rope_theta = c.ropes[0].theta;
  apply_arch(f, *info, c);
  c.n_vocab = vocab_size(f, a);

  c.has_qkv_bias = info->qkv_bias && f.find_tensor("blk.0.attn_q.bias") != nullptr;
  if ((c.arch == "qwen2moe" || info->gpt_oss) && !c.has_qkv_bias)  // the peers require them there
    throw ModelError(f.path() + ": tensor 'blk.0.attn_q.bias' is missing (" + c.arch + " has q/k/v biases)");
  c.moe = detail::moe_config_from_gguf(f, *info, c.ffn_dim);
  c.tied_output = !info->output_required && f.find_tensor("output.weight") == nullptr;
  // Which factor tensors the peers read: LongRoPE's pair for phi3 and for a
  // llama-like file of scaling type longrope, else Llama 3.1's rope_freqs
  // (any other factor tensor is then unused, hence refused by the loader).
  const bool longrope = c.arch == "phi3" || f.opt_str(a + "rope.scaling.type").value_or("") == "longrope";
  if (info->rope_freqs && !longrope && f.find_tensor("rope_freqs.weight")) c.rope_factors = RopeFactors::Freqs;
  else if (info->rope_long_short && longrope &&
           (f.find_tensor("rope_factors_long.weight") || f.find_tensor("rope_factors_short.weight")))
    c.rope_factors = RopeFactors::LongShort;
  c.weight_bytes = 0;
  for (const auto& t : f.tensors()) c.weight_bytes += t.nbytes;
  return c;
}

namespace detail {

void load_gguf(Model& m, const std::string& path) {
  m.gguf_ = GgufFile::open(path);
  const GgufFile& f = *m.gguf_;
  m.path_ = path;
  m.cfg_ = config_from_gguf(f);
  ModelConfig& c = m.cfg_;
  m.vocab_ = vocab_from_gguf(f);
  if (static_cast<int>(m.vocab_.size()) != c.n_vocab)
    throw ModelError(path + ": vocabulary has " + std::to_string(m.vocab_.size()) + " tokens, expected " +
                     std::to_string(c.n_vocab));

  TensorLoader t(m);
  ModelWeights& w = m.w_;
  w.tok_embd = t.matrix("token_embd.weight", c.n_vocab, c.dim);  // [n_vocab, dim]
  w.output_norm = t.vector("output_norm.weight", c.dim);        // [dim]
  w.output = c.tied_output ? w.tok_embd : t.matrix("output.weight", c.n_vocab, c.dim);  // [n_vocab, dim]
  const int64_t half = c.n_rot / 2;
  if (c.rope_factors == RopeFactors::Freqs) w.rope_freqs = t.vector("rope_freqs.weight", half);  // [n_rot/2]
  if (c.rope_factors == RopeFactors::LongShort) {
    w.rope_long = t.optional_vector("rope_factors_long.weight", half);    // [n_rot/2]
    w.rope_short = t.optional_vector("rope_factors_short.weight", half);  // [n_rot/2]
  }
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    load_attention(t, c, p, w.layers[l]);
    load_ffn(t, c, p, w.layers[l]);
  }
  const std::string beyond = "blk." + std::to_string(c.n_layers) + ".";
  for (const GgufTensorInfo& ti : f.tensors())
    if (ti.name.rfind(beyond, 0) == 0)
      throw ModelError(path + ": tensor '" + ti.name + "' exists but key '" + c.arch + ".block_count' says " +
                       std::to_string(c.n_layers) + " layers");
  t.refuse_unused();

  uint64_t file_size = 0;
  std::error_code ec;
  file_size = std::filesystem::file_size(path, ec);
  m.identity_ = model_identity(c, file_size, path);
}

}  // namespace detail

}  // namespace kvs
