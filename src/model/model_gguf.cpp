// GGUF -> ModelConfig (metadata only) and GGUF -> Model (weight views into
// the mapping). Every tensor's presence, shape and type is checked here so
// the engine can use the views without further checks.
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "model/loaders.h"
#include "model/vocab_loaders.h"

namespace kvs {

namespace {

const char* kSupportedArchs = "llama, mistral, qwen2";

// Architecture integer `key`: required unless `def` is given; must lie in [lo, hi].
int meta_int(const GgufFile& f, const std::string& key, std::optional<int> def, int64_t lo, int64_t hi) {
  std::optional<uint64_t> v = f.opt_u64(key);
  if (!v) {
    if (def) return *def;
    throw ModelError(f.path() + ": required key '" + key + "' is missing");
  }
  if (*v < static_cast<uint64_t>(lo) || *v > static_cast<uint64_t>(hi))
    throw ModelError(f.path() + ": key '" + key + "' = " + std::to_string(*v) + " is out of range [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(*v);
}

// A weight matrix [rows, cols] is stored with ggml dims {cols, rows}.
WeightView matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols) {
  const GgufTensorInfo& t = f.tensor(name, {cols, rows});
  const TypeTraits& tt = type_traits(t.type);
  if (!tt.supported)
    throw ModelError(f.path() + ": tensor '" + name + "' has type " + tt.name +
                     ", which kvserve cannot compute (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                     "Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4)");
  WeightView w;
  w.type = t.type;
  w.data = t.data;
  w.rows = rows;
  w.cols = cols;
  w.row_stride = row_bytes(t.type, cols);
  return w;
}

// A 1-D float vector [n] (norm weights, biases). Kept in the mapping when it
// is F32 and 4-byte aligned; F16/BF16 (or a misaligned F32) become owned f32.
const float* vector_f32(Model& m, const std::string& name, int64_t n) {
  const GgufFile& f = *m.gguf_;
  const GgufTensorInfo& t = f.tensor(name, {n});
  if (t.type == GgmlType::F32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0)
    return reinterpret_cast<const float*>(t.data);
  if (t.type != GgmlType::F32 && t.type != GgmlType::F16 && t.type != GgmlType::BF16)
    throw ModelError(f.path() + ": tensor '" + name + "' has type " + type_name(t.type) +
                     ", expected F32 (norm weights and biases are stored unquantized)");
  auto& buf = m.owned_f32_.emplace_back(static_cast<size_t>(n));
  dequantize_row(t.type, t.data, buf.data(), n);
  return buf.data();
}

}  // namespace

ModelConfig config_from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch = f.get_str("general.architecture");
  if (c.arch != "llama" && c.arch != "mistral" && c.arch != "qwen2")
    throw ModelError(f.path() + ": unsupported architecture '" + c.arch + "' (key 'general.architecture'; supported: " +
                     kSupportedArchs + ")");
  const std::string a = c.arch + ".";
  c.name = f.opt_str("general.name").value_or(std::filesystem::path(f.path()).stem().string());

  constexpr int64_t kBig = 1 << 20;  // far above any real width; rejects garbage early
  c.dim = meta_int(f, a + "embedding_length", std::nullopt, 1, kBig);
  c.n_layers = meta_int(f, a + "block_count", std::nullopt, 1, 4096);
  c.n_heads = meta_int(f, a + "attention.head_count", std::nullopt, 1, 4096);
  c.n_kv_heads = meta_int(f, a + "attention.head_count_kv", c.n_heads, 1, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    throw ModelError(f.path() + ": key '" + a + "attention.head_count_kv' = " + std::to_string(c.n_kv_heads) +
                     " does not divide head_count " + std::to_string(c.n_heads));
  const bool has_key_length = f.find(a + "attention.key_length") != nullptr;
  if (!has_key_length && c.dim % c.n_heads != 0)
    throw ModelError(f.path() + ": embedding_length " + std::to_string(c.dim) + " is not a multiple of head_count " +
                     std::to_string(c.n_heads) + " and '" + a + "attention.key_length' is missing");
  c.head_dim = meta_int(f, a + "attention.key_length", c.dim / c.n_heads, 1, 4096);
  const int value_length = meta_int(f, a + "attention.value_length", c.head_dim, 1, 4096);
  if (value_length != c.head_dim)
    throw ModelError(f.path() + ": key '" + a + "attention.value_length' = " + std::to_string(value_length) +
                     " differs from key_length " + std::to_string(c.head_dim) + " (not supported)");
  c.ffn_dim = meta_int(f, a + "feed_forward_length", std::nullopt, 1, 16 * kBig);
  c.n_ctx_train = meta_int(f, a + "context_length", std::nullopt, 1, 1 << 30);
  c.n_rot = meta_int(f, a + "rope.dimension_count", c.head_dim, 2, c.head_dim);
  if (c.n_rot % 2 != 0)
    throw ModelError(f.path() + ": key '" + a + "rope.dimension_count' = " + std::to_string(c.n_rot) + " is odd");
  c.rope_theta = static_cast<float>(f.opt_f64(a + "rope.freq_base").value_or(10000.0));
  if (!(c.rope_theta > 1.f))
    throw ModelError(f.path() + ": key '" + a + "rope.freq_base' = " + std::to_string(c.rope_theta) + " must be > 1");
  c.rms_eps = static_cast<float>(f.opt_f64(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(c.rms_eps > 0.f && c.rms_eps < 1.f))
    throw ModelError(f.path() + ": key '" + a + "attention.layer_norm_rms_epsilon' = " + std::to_string(c.rms_eps) +
                     " is not in (0, 1)");
  c.sliding_window = meta_int(f, a + "attention.sliding_window", 0, 0, 1 << 30);
  c.rope = c.arch == "qwen2" ? RopeStyle::Neox : RopeStyle::Normal;

  // Vocabulary size: the token list is authoritative, then the optional
  // vocab_size key, then the embedding table's shape.
  if (const GgufValue* toks = f.find("tokenizer.ggml.tokens")) {
    if (!toks->is_array()) throw ModelError(f.path() + ": key 'tokenizer.ggml.tokens' is not an array");
    c.n_vocab = static_cast<int>(std::min<size_t>(toks->as_arr().size(), 1u << 30));
  } else if (f.find(a + "vocab_size")) {
    c.n_vocab = meta_int(f, a + "vocab_size", std::nullopt, 1, 1 << 30);
  } else if (const GgufTensorInfo* e = f.find_tensor("token_embd.weight"); e && e->dims.size() == 2) {
    c.n_vocab = static_cast<int>(std::min<int64_t>(e->dims[1], 1 << 30));
  } else {
    throw ModelError(f.path() + ": cannot tell the vocabulary size: key 'tokenizer.ggml.tokens' is missing");
  }
  if (c.n_vocab <= 0) throw ModelError(f.path() + ": key 'tokenizer.ggml.tokens' is empty");

  c.has_qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.tied_output = f.find_tensor("output.weight") == nullptr;
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

  const int64_t dim = c.dim, qdim = int64_t(c.n_heads) * c.head_dim, kvdim = int64_t(c.n_kv_heads) * c.head_dim;
  ModelWeights& w = m.w_;
  w.tok_embd = matrix(f, "token_embd.weight", c.n_vocab, dim);  // [n_vocab, dim]
  w.output_norm = vector_f32(m, "output_norm.weight", dim);     // [dim]
  w.output = c.tied_output ? w.tok_embd : matrix(f, "output.weight", c.n_vocab, dim);  // [n_vocab, dim]

  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[l];
    L.attn_norm = vector_f32(m, p + "attn_norm.weight", dim);     // [dim]
    L.wq = matrix(f, p + "attn_q.weight", qdim, dim);             // [n_heads*hd, dim]
    L.wk = matrix(f, p + "attn_k.weight", kvdim, dim);            // [n_kv*hd, dim]
    L.wv = matrix(f, p + "attn_v.weight", kvdim, dim);            // [n_kv*hd, dim]
    L.wo = matrix(f, p + "attn_output.weight", dim, qdim);        // [dim, n_heads*hd]
    if (c.has_qkv_bias) {
      L.bq = vector_f32(m, p + "attn_q.bias", qdim);              // [n_heads*hd]
      L.bk = vector_f32(m, p + "attn_k.bias", kvdim);             // [n_kv*hd]
      L.bv = vector_f32(m, p + "attn_v.bias", kvdim);             // [n_kv*hd]
    }
    L.ffn_norm = vector_f32(m, p + "ffn_norm.weight", dim);       // [dim]
    L.w_gate = matrix(f, p + "ffn_gate.weight", c.ffn_dim, dim);  // [ffn, dim]
    L.w_up = matrix(f, p + "ffn_up.weight", c.ffn_dim, dim);      // [ffn, dim]
    L.w_down = matrix(f, p + "ffn_down.weight", dim, c.ffn_dim);  // [dim, ffn]
  }
  if (f.find_tensor("blk." + std::to_string(c.n_layers) + ".attn_q.weight"))
    throw ModelError(path + ": tensor 'blk." + std::to_string(c.n_layers) + ".attn_q.weight' exists but key '" +
                     c.arch + ".block_count' says " + std::to_string(c.n_layers) + " layers");

  uint64_t file_size = 0;
  std::error_code ec;
  file_size = std::filesystem::file_size(path, ec);
  m.identity_ = model_identity(c, file_size, path);
}

}  // namespace detail

}  // namespace kvs
