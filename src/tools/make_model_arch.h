// What `kvserve make-model --arch A` writes for each architecture: the keys
// and the tensor names and shapes llama.cpp and ik_llama.cpp expect of it
// (their loaders: src/llama-model.cpp, src/llama-load-tensors.cpp), so the
// peers load the same file kvserve does. make_model.cpp owns the random
// values and the writer; this file decides what goes in.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/gguf_writer.h"
#include "tools/make_model.h"

namespace kvs {

// The options with the architecture's defaults filled in (head dim, window,
// RoPE base, soft-caps, tied output). Throws std::invalid_argument naming the
// flag for a combination the architecture cannot honour, or a bad shape.
MakeModelOptions resolve_arch_options(const MakeModelOptions& o);

// "<arch>.*" keys after the general.* ones, as the converters write them.
// `o` must be resolved.
void write_arch_keys(GgufWriter& w, const MakeModelOptions& o, const std::string& name);

// Where the tensors' values come from (make_model.cpp): random matrices
// [rows, cols] with the given standard deviation, norm weights, biases, and
// fixed values.
struct TensorSource {
  std::function<void(const std::string& name, int64_t rows, int64_t cols, float stddev)> matrix;
  std::function<void(const std::string& name, int64_t n)> norm;
  std::function<void(const std::string& name, int64_t n)> bias;
  std::function<void(const std::string& name, const std::vector<float>& values)> values;
  // A random tensor of ggml dims `dims` (rows of dims[0]) in `type`: a MoE
  // layer's 3-D experts, its F32 router.
  std::function<void(const std::string& name, const std::vector<int64_t>& dims, float stddev, GgmlType type)> tensor;
};

// Every tensor of the architecture, in the order the converters write
// them. `o` must be resolved.
void write_arch_tensors(const MakeModelOptions& o, int n_vocab, const TensorSource& src);

}  // namespace kvs
