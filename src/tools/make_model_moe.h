// The mixture-of-experts part of `make-model` (tools/make_model.h): the
// expert keys and each layer's router, experts and shared expert, named and
// shaped as llama.cpp b4748 reads them (llama with experts = Mixtral-style,
// qwen2moe with its shared expert, qwen3moe; gpt-oss as ik_llama.cpp reads it).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "model/gguf_writer.h"
#include "tools/make_model.h"

namespace kvs {

// True for a model whose FFNs are mixtures of experts.
bool moe_model(const MakeModelOptions& o);
// The options with the MoE defaults filled in (qwen2moe / qwen3moe /
// gpt-oss: 8 experts; top 2, gpt-oss top 4; expert and shared widths = ffn;
// expert type: gpt-oss MXFP4, else the file's type). Throws
// std::invalid_argument naming the flag (--experts, --experts-used,
// --expert-ffn, --shared-ffn) when a value cannot be honoured.
MakeModelOptions moe_defaults(const MakeModelOptions& o);
// The ARCH.expert_* keys.
void set_moe_keys(GgufWriter& w, const MakeModelOptions& o);
// Adds a seeded random tensor of ggml dims `dims` (rows of dims[0]) with
// N(0, stddev) values in `type`.
using RandomTensorFn =
    std::function<void(const std::string& name, const std::vector<int64_t>& dims, float stddev, GgmlType type)>;
// Layer `prefix` ("blk.N.")'s MoE FFN tensors: the router (F32, as the
// peers' converters keep it), the 3-D expert tensors in o.expert_type, for
// qwen2moe the shared expert and its F32 gate vector, for gpt-oss the
// router's and the experts' F32 biases. `down_scale` scales
// the down projections (the residual branch's output) as for dense layers.
void add_moe_ffn(const MakeModelOptions& o, const std::string& prefix, float down_scale, const RandomTensorFn& random);

}  // namespace kvs
