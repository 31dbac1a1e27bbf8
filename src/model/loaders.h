// Internal to src/model: the two file-format loaders behind Model::load, and
// the identity hash they share.
#pragma once
#include <cstdint>
#include <string>

#include "model/arch.h"
#include "model/model.h"
#include "model/tensor_loader.h"

namespace kvs::detail {

// Fills m from a GGUF file (weights stay in the mapping).
void load_gguf(Model& m, const std::string& path);
// Fills m from a llama2.c checkpoint; `tok` may be empty (then tok512.bin or
// tokenizer.bin next to the checkpoint).
void load_llama2c(Model& m, const std::string& path, const std::string& tok);

// Mixture-of-experts FFN (moe_gguf.cpp). The MoE keys of the file's
// architecture: n_expert == 0 for a dense model. Throws ModelError naming
// the key (a missing or out-of-range count, a gating option kvserve would
// not honour) or the tensor (ffn_gate_inp without expert_count, and back).
MoeConfig moe_config_from_gguf(const GgufFile& f, const ArchInfo& arch, int ffn_dim);
// One layer's router, expert slices and shared expert (prefix "blk.N.").
void load_moe_layer(TensorLoader& t, const ModelConfig& c, const std::string& prefix, MoeWeights& w);

// sha256 hex over the architecture, shape, file size and path: stable for the
// same file, different for different weights files (prefix-cache scoping).
std::string model_identity(const ModelConfig& c, uint64_t file_size, const std::string& path);
// Lower-case hex SHA-256 of msg.
std::string sha256_hex(const std::string& msg);

}  // namespace kvs::detail
