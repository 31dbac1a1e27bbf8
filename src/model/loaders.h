// Internal to src/model: the two file-format loaders behind Model::load, and
// the identity hash they share.
#pragma once
#include <cstdint>
#include <string>

#include "model/model.h"

namespace kvs::detail {

// Fills m from a GGUF file (weights stay in the mapping).
void load_gguf(Model& m, const std::string& path);
// Fills m from a llama2.c checkpoint; `tok` may be empty (then tok512.bin or
// tokenizer.bin next to the checkpoint).
void load_llama2c(Model& m, const std::string& path, const std::string& tok);

// Weight views for the GGUF loaders (model_gguf.cpp), each checked: a
// weight [rows, cols] viewing tensor t (its type must be one kvserve
// computes); the matrix `name` of ggml dims {cols, rows}; the float vector
// `name` [n] (F32 kept in the mapping, F16/BF16 converted into m's buffers).
WeightView weight_view(const GgufFile& f, const GgufTensorInfo& t, int64_t rows, int64_t cols);
WeightView matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols);
const float* vector_f32(Model& m, const std::string& name, int64_t n);

// Mixture-of-experts FFN (moe_gguf.cpp). The MoE keys of the file's
// architecture: n_expert == 0 for a dense model. Throws ModelError naming
// the key (a missing or out-of-range count, a gating option kvserve would
// not honour) or the tensor (ffn_gate_inp without expert_count, and back).
MoeConfig moe_config_from_gguf(const GgufFile& f, const std::string& arch, int ffn_dim);
// Layer l's router, expert slices and shared expert into L.moe; refuses a
// dense FFN tensor next to them, and expert tensors of the wrong shape.
void load_moe_layer(Model& m, int l, LayerWeights& L);

// sha256 hex over the architecture, shape, file size and path: stable for the
// same file, different for different weights files (prefix-cache scoping).
std::string model_identity(const ModelConfig& c, uint64_t file_size, const std::string& path);

}  // namespace kvs::detail
