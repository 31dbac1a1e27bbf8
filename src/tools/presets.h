// Model shapes for planning: the architecture numbers that decide KV size and
// decode cost, from a built-in preset of a public model or from a GGUF file's
// metadata and tensor table (no weights are read).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvs::tools {

// Storage types the planner can price a preset's weights in. Bytes per block
// follow ggml's block formats (kernels/quant.h): Q8_0 34 B / 32 weights,
// Q6_K 210 B / 256, Q4_K 144 B / 256, Q4_0 18 B / 32.
enum class WeightQuant { F32, F16, BF16, Q8_0, Q6_K, Q4_K, Q4_0, MXFP4 };

WeightQuant parse_weight_quant(const std::string& s);  // "f16", "q8_0", ... (throws)
std::string weight_quant_name(WeightQuant q);
// Which peak rate the matmuls of this storage type run at on a CPU: float
// weights use FP32 FMA, bf16 the BF16 dot, block-quantized ones the int8 dot
// (activations are quantized to 8 bits, as ggml does).
std::string compute_path_for(WeightQuant q);

struct ModelShape {
  std::string name;         // preset name or GGUF general.name / file stem
  std::string arch;         // "llama", "mistral", "qwen2"
  std::string source;       // "preset" or the GGUF path
  int n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int dim = 0, ffn_dim = 0, n_vocab = 0, n_ctx = 0;
  bool tied_output = false;  // output projection reuses token_embd
  bool qkv_bias = false;     // Qwen2 has q/k/v biases
  int64_t published_params = 0;  // from the model card; 0 if not a public model or not counted exactly
  // Mixture of experts (n_expert > 0): every layer's FFN is n_expert experts
  // of expert_ffn (ffn_dim unused), a router of [n_expert, dim], k run per
  // token. gpt-oss adds biases on the router, the experts and the attention
  // output, one learned sink per head, and ships its experts in MXFP4.
  int expert_ffn = 0;
  bool gpt_oss_extras = false;
  // Per layer: its sliding window (0 = the whole context); empty = none.
  // Layers of different windows make a hybrid KV cache (kernels/kv_groups.h).
  std::vector<int> layer_window;

  // Filled by priced_shape() / shape_from_gguf():
  std::string weight_type;         // "f16", "q4_0", or "mixed (q4_0 + ...)" from GGUF
  std::string compute_path;        // "fp32", "bf16" or "int8"
  uint64_t weight_bytes = 0;       // all tensors as stored (what must be resident)
  uint64_t streamed_weight_bytes = 0;  // read by every decode step: all but an untied token_embd (MoE: every expert, as a batch reaches most)
  uint64_t expert_bytes = 0;           // MoE: the routed experts' share of streamed_weight_bytes
  int n_expert = 0, n_expert_used = 0;  // MoE: experts per layer, experts a token runs
  int64_t matmul_params = 0;       // weights multiplied per token (2 FLOPs each; MoE: the k experts a token runs)
  int64_t total_params = 0;        // every parameter, embeddings and norms included
};

// Parameters implied by the shape (embeddings, attention, SwiGLU FFN, norms,
// qkv biases, output unless tied). Matches the published counts of the
// presets exactly; tests hold it to that.
int64_t shape_param_count(const ModelShape& s);

// Fills weight_type / weight_bytes / streamed_weight_bytes / matmul_params for
// storing every 2-D tensor as `q` (1-D norms and biases stay f32, as in GGUF).
// A matrix whose rows do not divide into q's block falls back to Q8_0 (then
// F16), the same fallback llama.cpp's quantizer takes.
ModelShape priced_shape(ModelShape s, WeightQuant q);

// Built-in presets (unpriced: call priced_shape). Throws std::invalid_argument
// listing the known names when `name` is not one of them.
const std::vector<ModelShape>& presets();
ModelShape find_preset(const std::string& name);
std::string preset_names();  // "llama-2-7b, llama-2-70b, ..."

// Shape and exact stored weight bytes of a GGUF file, from its metadata and
// tensor table only (kvs::config_from_gguf + tensor sizes).
ModelShape shape_from_gguf(const std::string& path);

}  // namespace kvs::tools
