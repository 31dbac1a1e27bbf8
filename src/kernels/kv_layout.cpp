#include "kernels/kv_layout.h"

#include <stdexcept>

namespace kvs {

KvType parse_kv_type(const std::string& s) {
  if (s == "f32") return KvType::F32;
  if (s == "f16") return KvType::F16;
  if (s == "bf16") return KvType::BF16;
  if (s == "int8" || s == "q8") return KvType::Int8;
  if (s == "int4" || s == "q4") return KvType::Int4;
  throw std::invalid_argument("unknown KV type '" + s + "': use f32, f16, bf16, int8 or int4");
}

const char* to_string(KvType t) {
  switch (t) {
    case KvType::F32: return "f32";
    case KvType::F16: return "f16";
    case KvType::BF16: return "bf16";
    case KvType::Int8: return "int8";
    case KvType::Int4: return "int4";
  }
  return "?";
}

KeyScale parse_key_scale(const std::string& s) {
  if (s == "channel") return KeyScale::Channel;
  if (s == "token") return KeyScale::Token;
  throw std::invalid_argument("unknown key scaling '" + s + "': use channel or token");
}

const char* to_string(KeyScale k) { return k == KeyScale::Channel ? "channel" : "token"; }

void KvLayout::validate() const {
  if (block_size < 1 || n_layers < 1 || n_kv_heads < 1 || head_dim < 1)
    throw std::invalid_argument("KV layout: every dimension must be >= 1");
  if (!groups.tables.empty() && (groups.n_layers != n_layers || int(groups.table_of.size()) != n_layers ||
                                 int(groups.slot_of.size()) != n_layers || groups.slots < 1))
    throw std::invalid_argument("KV layout: the layer groups are for " + std::to_string(groups.n_layers) +
                                " layers, the layout has " + std::to_string(n_layers));
  if (!quantized()) return;
  if (kvdim() % 2 != 0) throw std::invalid_argument("quantized KV cache: n_kv_heads * head_dim must be even");
  if (group_channels < 1) throw std::invalid_argument("--kv-group must be >= 1 channel");
  if (group_tokens < 1 || block_size % group_tokens != 0)
    throw std::invalid_argument("--kv-residual (tokens per key group) must divide the block size " +
                                std::to_string(block_size) + ", got " + std::to_string(group_tokens));
  if (key_scale == KeyScale::Channel && group_tokens < 2)
    throw std::invalid_argument("per-channel keys need --kv-residual >= 2 tokens to share a scale");
}

std::string KvLayout::describe() const {
  // One table is the layout as it always was: the same text, so identities
  // (tiers, transfers, saved sequences) of such models do not change.
  const std::string grouping = groups.hybrid() ? "; " + groups.describe() : "";
  if (!quantized()) return to_string(type) + grouping;
  std::string s = to_string(type);
  if (key_scale == KeyScale::Channel) s += " keys/channel g" + std::to_string(group_tokens);
  else s += " keys/token c" + std::to_string(group_channels);
  s += ", values/token c" + std::to_string(group_channels) + ", residual " + std::to_string(group_tokens);
  return s + grouping;
}

}  // namespace kvs
