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

// sha256 hex over the architecture, shape, file size and path: stable for the
// same file, different for different weights files (prefix-cache scoping).
std::string model_identity(const ModelConfig& c, uint64_t file_size, const std::string& path);

}  // namespace kvs::detail
