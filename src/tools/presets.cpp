// Built-in model shapes and weight pricing. Every preset figure is taken from
// the model's published Hugging Face config.json / model card (cited per
// entry); the parameter count each implies is checked against the published
// total in tests/test_plan.cpp, which catches a mistyped shape.
#include "tools/presets.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "kernels/quant.h"
#include "model/gguf.h"
#include "model/model.h"

namespace kvs::tools {
namespace {

struct QuantInfo {
  WeightQuant q;
  const char* name;
  int block_elems;
  int block_bytes;
  const char* path;
};

// ggml block formats (see kernels/quant.h for the struct layouts). The path
// is what the matmul kernels run: BF16 weights are widened to f32 exactly
// and go through FP32 FMA like F16 (vdpbf16ps is slower here; PERFORMANCE.md).
const QuantInfo kQuants[] = {
    {WeightQuant::F32, "f32", 1, 4, "fp32"},      {WeightQuant::F16, "f16", 1, 2, "fp32"},
    {WeightQuant::BF16, "bf16", 1, 2, "fp32"},    {WeightQuant::Q8_0, "q8_0", 32, 34, "int8"},
    {WeightQuant::Q6_K, "q6_k", 256, 210, "int8"}, {WeightQuant::Q4_K, "q4_k", 256, 144, "int8"},
    {WeightQuant::Q4_0, "q4_0", 32, 18, "int8"},  {WeightQuant::MXFP4, "mxfp4", 32, 17, "int8"},
};

const QuantInfo& info(WeightQuant q) {
  for (const auto& i : kQuants)
    if (i.q == q) return i;
  throw std::invalid_argument("unknown weight quantization");
}

// Bytes of an [rows, cols] matrix stored as q, with llama.cpp's fallback for
// rows that do not divide into q's block.
uint64_t matrix_bytes(int64_t rows, int64_t cols, WeightQuant q, bool* fell_back) {
  for (WeightQuant t : {q, WeightQuant::Q8_0, WeightQuant::F16}) {
    const QuantInfo& qi = info(t);
    if (cols % qi.block_elems != 0) continue;
    if (t != q && fell_back) *fell_back = true;
    return uint64_t(rows) * uint64_t(cols / qi.block_elems) * uint64_t(qi.block_bytes);
  }
  return uint64_t(rows) * uint64_t(cols) * 2;  // F16 always divides
}

ModelShape make(const char* name, const char* arch, int layers, int heads, int kv_heads, int head_dim,
                int dim, int ffn, int vocab, int ctx, bool tied, bool bias, int64_t published) {
  ModelShape s;
  s.name = name;
  s.arch = arch;
  s.source = "preset";
  s.n_layers = layers;
  s.n_heads = heads;
  s.n_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.dim = dim;
  s.ffn_dim = ffn;
  s.n_vocab = vocab;
  s.n_ctx = ctx;
  s.tied_output = tied;
  s.qkv_bias = bias;
  s.published_params = published;
  return s;
}

// A mixture-of-experts FFN on every layer: E experts of width eff, k per token.
ModelShape moe(ModelShape s, int n_expert, int n_used, int expert_ffn) {
  s.n_expert = n_expert;
  s.n_expert_used = n_used;
  s.expert_ffn = expert_ffn;
  s.ffn_dim = 0;
  return s;
}

// gpt-oss: its biases and sinks, and a window on even layers.
ModelShape gpt_oss(ModelShape s, int window) {
  s.gpt_oss_extras = true;
  for (int l = 0; l < s.n_layers; ++l) s.layer_window.push_back(l % 2 == 0 ? window : 0);
  return s;
}

// Gemma 3's pattern: five local (windowed) layers, then a global one.
ModelShape gemma3(ModelShape s, int window) {
  for (int l = 0; l < s.n_layers; ++l) s.layer_window.push_back((l + 1) % 6 == 0 ? 0 : window);
  return s;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

WeightQuant parse_weight_quant(const std::string& s) {
  const std::string l = lower(s);
  for (const auto& i : kQuants)
    if (l == i.name) return i.q;
  std::string names;
  for (const auto& i : kQuants) names += std::string(names.empty() ? "" : ", ") + i.name;
  throw std::invalid_argument("unknown weight type '" + s + "' (expected one of: " + names + ")");
}

std::string weight_quant_name(WeightQuant q) { return info(q).name; }
std::string compute_path_for(WeightQuant q) { return info(q).path; }

int64_t shape_param_count(const ModelShape& s) {
  const int64_t q_out = int64_t(s.n_heads) * s.head_dim;
  const int64_t kv_out = int64_t(s.n_kv_heads) * s.head_dim;
  int64_t layer = s.dim * q_out            // wq
                  + 2 * s.dim * kv_out     // wk, wv
                  + q_out * s.dim          // wo
                  + 3 * int64_t(s.dim) * s.ffn_dim  // gate, up, down
                  + 2 * int64_t(s.dim);    // attention and FFN RMSNorm
  if (s.qkv_bias) layer += q_out + 2 * kv_out;
  if (s.n_expert > 0) {
    const int64_t d = s.dim, e = s.n_expert, f = s.expert_ffn;
    layer += d * e + e * 3 * d * f - 3 * d * int64_t(s.ffn_dim);  // router and experts for the dense FFN
    if (s.gpt_oss_extras) layer += e + e * (2 * f + d) + d + s.n_heads;  // router, expert, output biases; sinks
  }
  const int64_t embd = int64_t(s.n_vocab) * s.dim;
  return int64_t(s.n_layers) * layer + embd * (s.tied_output ? 1 : 2) + s.dim /* final norm */;
}

ModelShape priced_shape(ModelShape s, WeightQuant q) {
  const int64_t q_out = int64_t(s.n_heads) * s.head_dim;
  const int64_t kv_out = int64_t(s.n_kv_heads) * s.head_dim;
  bool fell_back = false;
  // Per layer: matrices in q, norms and biases in f32.
  uint64_t layer = matrix_bytes(q_out, s.dim, q, &fell_back) + 2 * matrix_bytes(kv_out, s.dim, q, &fell_back) +
                   matrix_bytes(s.dim, q_out, q, &fell_back) + 2 * matrix_bytes(s.ffn_dim, s.dim, q, &fell_back) +
                   matrix_bytes(s.dim, s.ffn_dim, q, &fell_back) + 4ull * 2 * uint64_t(s.dim);
  if (s.qkv_bias) layer += 4ull * uint64_t(q_out + 2 * kv_out);
  uint64_t experts = 0;  // one layer's
  int64_t ffn_params = 3 * int64_t(s.dim) * s.ffn_dim;
  if (s.n_expert > 0) {
    const int64_t d = s.dim, e = s.n_expert, f = s.expert_ffn;
    const WeightQuant eq = s.gpt_oss_extras ? WeightQuant::MXFP4 : q;  // as the published files
    experts = uint64_t(e) * (2 * matrix_bytes(f, d, eq, &fell_back) + matrix_bytes(d, f, eq, &fell_back));
    layer += experts + matrix_bytes(e, d, q, &fell_back);
    if (s.gpt_oss_extras) layer += 4ull * uint64_t(e + e * (2 * f + d) + d + s.n_heads);
    ffn_params = e * d + int64_t(s.n_expert_used) * 3 * d * f;
  }
  const uint64_t embd = matrix_bytes(s.n_vocab, s.dim, q, &fell_back);
  const uint64_t fixed = embd * (s.tied_output ? 1 : 2) + 4ull * uint64_t(s.dim);
  s.weight_bytes = uint64_t(s.n_layers) * layer + fixed;
  // An untied token_embd is only gathered (one row per token), never streamed.
  s.streamed_weight_bytes = s.weight_bytes - (s.tied_output ? 0 : embd);
  s.expert_bytes = uint64_t(s.n_layers) * experts;
  s.matmul_params = int64_t(s.n_layers) * (2 * q_out * s.dim + 2 * kv_out * s.dim + ffn_params) +
                    int64_t(s.n_vocab) * s.dim;
  s.total_params = shape_param_count(s);
  s.weight_type = weight_quant_name(q) + (fell_back ? " (some rows q8_0/f16)" : "") +
                  (s.gpt_oss_extras && q != WeightQuant::MXFP4 ? " (experts mxfp4)" : "");
  s.compute_path = compute_path_for(q);
  return s;
}

const std::vector<ModelShape>& presets() {
  // name, arch, layers, heads, kv_heads, head_dim, dim, ffn, vocab, ctx, tied, qkv_bias, published params
  static const std::vector<ModelShape> p = {
      // meta-llama/Llama-2-7b-hf config.json: 32 layers, 32 heads (MHA), dim 4096,
      // intermediate 11008, vocab 32000, 4096 positions; 6,738,415,616 params.
      make("llama-2-7b", "llama", 32, 32, 32, 128, 4096, 11008, 32000, 4096, false, false, 6738415616),
      // meta-llama/Llama-2-70b-hf: 80 layers, 64 heads, 8 KV heads, dim 8192,
      // intermediate 28672, vocab 32000, 4096 positions; 68,976,648,192 params.
      make("llama-2-70b", "llama", 80, 64, 8, 128, 8192, 28672, 32000, 4096, false, false, 68976648192),
      // meta-llama/Meta-Llama-3-8B: 32 layers, 32 heads, 8 KV heads, dim 4096,
      // intermediate 14336, vocab 128256, 8192 positions; 8,030,261,248 params.
      make("llama-3-8b", "llama", 32, 32, 8, 128, 4096, 14336, 128256, 8192, false, false, 8030261248),
      // meta-llama/Llama-3.1-70B: 80 layers, 64 heads, 8 KV heads, dim 8192,
      // intermediate 28672, vocab 128256, 131072 positions; 70,553,706,496 params.
      make("llama-3.1-70b", "llama", 80, 64, 8, 128, 8192, 28672, 128256, 131072, false, false, 70553706496),
      // mistralai/Mistral-7B-v0.1: 32 layers, 32 heads, 8 KV heads, dim 4096,
      // intermediate 14336, vocab 32000, 32768 positions (4096 sliding window);
      // 7,241,732,096 params.
      make("mistral-7b", "mistral", 32, 32, 8, 128, 4096, 14336, 32000, 32768, false, false, 7241732096),
      // Qwen/Qwen2.5-0.5B: 24 layers, 14 heads, 2 KV heads, dim 896, intermediate
      // 4864, vocab 151936, 32768 positions, tied embeddings, qkv bias; 494,032,768 params.
      make("qwen2.5-0.5b", "qwen2", 24, 14, 2, 64, 896, 4864, 151936, 32768, true, true, 494032768),
      // Qwen/Qwen2.5-7B: 28 layers, 28 heads, 4 KV heads, dim 3584, intermediate
      // 18944, vocab 152064, 131072 positions (with YaRN); 7,615,616,512 params.
      make("qwen2.5-7b", "qwen2", 28, 28, 4, 128, 3584, 18944, 152064, 131072, false, true, 7615616512),
      // Qwen/Qwen2.5-72B: 80 layers, 64 heads, 8 KV heads, dim 8192, intermediate
      // 29568, vocab 152064, 131072 positions (with YaRN); 72,706,203,648 params.
      make("qwen2.5-72b", "qwen2", 80, 64, 8, 128, 8192, 29568, 152064, 131072, false, true, 72706203648),
      // Gemma 3 (text), from the GGUF metadata Google published
      // (gemma-3-*-it-q4_0.gguf: gemma3.block_count, attention.head_count /
      // head_count_kv / key_length, embedding_length, feed_forward_length,
      // context_length, attention.sliding_window), every sixth layer global.
      // Parameters not counted exactly (Gemma's extra norms): published 0.
      // 1B: 26 layers, 4 heads, 1 KV head x 256, dim 1152, ffn 6912, window 1024.
      gemma3(make("gemma-3-1b", "gemma3", 26, 4, 1, 256, 1152, 6912, 262144, 32768, true, false, 0), 1024),
      // 4B: 34 layers, 8 heads, 4 KV heads x 256, dim 2560, ffn 10240, window 1024.
      gemma3(make("gemma-3-4b", "gemma3", 34, 8, 4, 256, 2560, 10240, 262208, 131072, true, false, 0), 1024),
      // 27B: 62 layers, 32 heads, 16 KV heads x 128, dim 5376, ffn 21504, window 1024.
      gemma3(make("gemma-3-27b", "gemma3", 62, 32, 16, 128, 5376, 21504, 262208, 131072, true, false, 0), 1024),
      // mistralai/Mixtral-8x7B-v0.1: 32 layers, 32 heads, 8 KV heads, dim 4096,
      // 8 experts of 14336 (2 per token), vocab 32000, 32768 positions;
      // 46,702,792,704 params.
      moe(make("mixtral-8x7b", "llama", 32, 32, 8, 128, 4096, 0, 32000, 32768, false, false, 46702792704), 8, 2,
          14336),
      // Qwen/Qwen3-30B-A3B: 48 layers, 32 heads, 4 KV heads x 128, dim 2048,
      // 128 experts of 768 (8 per token), vocab 151936, 40960 positions; the
      // card's "30.5B" (q/k norms not counted here: published 0).
      moe(make("qwen3-30b-a3b", "qwen3moe", 48, 32, 4, 128, 2048, 0, 151936, 40960, false, false, 0), 128, 8, 768),
      // openai/gpt-oss-20b and -120b: dim 2880, 64 heads, 8 KV heads x 64,
      // experts of 2880 (4 per token; 32 / 128 of them), vocab 201088,
      // 131072 positions, a 128-token window on even layers; the card's
      // 20.91B / 116.83B total, 3.61B / 5.13B active (not exact: published 0).
      gpt_oss(moe(make("gpt-oss-20b", "gpt-oss", 24, 64, 8, 64, 2880, 0, 201088, 131072, false, true, 0), 32, 4,
                  2880),
              128),
      gpt_oss(moe(make("gpt-oss-120b", "gpt-oss", 36, 64, 8, 64, 2880, 0, 201088, 131072, false, true, 0), 128, 4,
                  2880),
              128),
      // kvserve's own 1.1B benchmark model (random weights, written by
      // `kvserve make-model`): dim 2048, 16 layers, 32 heads, 8 KV heads,
      // head_dim 64, ffn 8192, vocab 32000, untied output. Not a public model.
      make("kvs-bench-1.1b", "llama", 16, 32, 8, 64, 2048, 8192, 32000, 2048, false, false, 0),
  };
  return p;
}

std::string preset_names() {
  std::string out;
  for (const auto& s : presets()) out += (out.empty() ? "" : ", ") + s.name;
  return out;
}

ModelShape find_preset(const std::string& name) {
  const std::string l = lower(name);
  for (const auto& s : presets())
    if (s.name == l) return s;
  throw std::invalid_argument("unknown model preset '" + name + "' (known: " + preset_names() + ")");
}

ModelShape shape_from_gguf(const std::string& path) {
  auto f = GgufFile::open(path);
  const ModelConfig c = config_from_gguf(*f);
  ModelShape s;
  // Converters often leave general.name as the architecture ("llama"); the
  // file name tells an operator more then.
  s.name = c.name.empty() || c.name == c.arch ? std::filesystem::path(path).stem().string() : c.name;
  s.arch = c.arch;
  s.source = path;
  s.n_layers = c.n_layers;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.dim = c.dim;
  s.ffn_dim = c.ffn_dim;
  s.n_vocab = c.n_vocab;
  s.n_ctx = c.n_ctx_train;
  s.tied_output = c.tied_output || f->find_tensor("output.weight") == nullptr;
  s.qkv_bias = c.has_qkv_bias;
  s.layer_window = c.layer_window;
  // Exact stored sizes from the tensor table; the 2-D type holding the most
  // bytes names the file's weight type and decides the compute path.
  std::map<std::string, uint64_t> bytes_by_type;
  uint64_t total = 0, embd = 0;
  int64_t matmul = 0, params = 0;
  GgmlType main_type = GgmlType::F32;
  uint64_t main_bytes = 0;
  for (const auto& t : f->tensors()) {
    total += t.nbytes;
    params += t.n_elements();
    if (t.dims.size() < 2) continue;
    const uint64_t b = (bytes_by_type[type_name(t.type)] += t.nbytes);
    if (b > main_bytes) main_bytes = b, main_type = t.type;
    if (t.name == "token_embd.weight") {
      embd = t.nbytes;
      if (s.tied_output) matmul += t.n_elements();  // used as the output projection
    } else if (t.dims.size() == 3 && c.moe.n_expert > 0) {
      matmul += t.n_elements() / c.moe.n_expert * c.moe.n_used;  // a token runs k of the experts
      s.expert_bytes += t.nbytes;
    } else {
      matmul += t.n_elements();
    }
  }
  s.weight_bytes = total;
  s.streamed_weight_bytes = total - (s.tied_output ? 0 : embd);
  s.n_expert = c.moe.n_expert;
  s.n_expert_used = c.moe.n_used;
  s.expert_ffn = c.moe.ffn_dim;
  s.matmul_params = matmul;
  s.total_params = params;
  s.weight_type = type_name(main_type);
  if (bytes_by_type.size() > 1) {
    std::string others;
    for (const auto& [n, b] : bytes_by_type)
      if (n != s.weight_type) others += " + " + n;
    s.weight_type = "mixed (" + s.weight_type + others + ")";
  }
  s.compute_path = (main_type == GgmlType::F32 || main_type == GgmlType::F16 || main_type == GgmlType::BF16)
                       ? "fp32"  // float weights run on FP32 FMA (kQuants above)
                       : "int8";
  if (s.weight_bytes == 0) s.weight_bytes = c.weight_bytes;
  return s;
}

}  // namespace kvs::tools
