// What both ends of a KV transfer must agree on before a block moves: the
// protocol version, the model (its identity hash) and the KV layout (type,
// block size, layers, KV heads, head dim, bytes per block, residual size).
// Blocks are copied byte for byte, so any difference would make the decode
// side attend over garbage; the handshake refuses it and names the field.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/kv_layout.h"

namespace kvs::disagg {

inline constexpr uint32_t kProtocolVersion = 1;

struct KvIdentity {
  uint32_t version = kProtocolVersion;
  std::string model;       // Model::identity() (a hash of the weights and config)
  std::string kv_type;     // "f32", "int8", ...
  std::string layout;      // KvLayout::describe(): quantization details
  int32_t block_size = 0, n_layers = 0, n_kv_heads = 0, head_dim = 0;
  uint64_t block_bytes = 0, residual_floats = 0;
  bool operator==(const KvIdentity&) const = default;
};

KvIdentity make_identity(const std::string& model_identity, const KvLayout& layout);

// Empty when `theirs` can exchange blocks with `mine`; else one line naming
// every field that differs, with both values ("kv type: int8 here, f16 there").
std::string mismatch(const KvIdentity& mine, const KvIdentity& theirs);

}  // namespace kvs::disagg
