// Where K and V live. All KV memory is cut into blocks of `block_size` token
// slots; a block holds K and V of `slots()` layer slots for its token slots:
//   block b, layer slot s: K area, then V area
// With one KV table (every model whose layers share one window) the slots
// are the layers: slot s = layer s. A hybrid cache (kernels/kv_groups.h)
// has several tables; layer l lives in slot groups.slot_of[l] of the blocks
// of table groups.table_of[l]. A sequence's K/V are addressed through its
// block table of that table (logical block i -> physical block id), so
// attention never needs a contiguous copy.
//
// Element types (--kv-type):
//   f32, f16, bf16  K and V rows [block_size, n_kv_heads * head_dim], written
//                   as each token is computed.
//   int8, int4      asymmetric (scale, min as fp16; x = min + scale * q).
//       Values, and keys with KeyScale::Token: per token, one (scale, min)
//       per `group_channels` consecutive elements of the row (the last
//       group may be shorter, so any head_dim works).
//       Keys with KeyScale::Channel (KIVI): per channel, one (scale, min)
//       over `group_tokens` consecutive tokens, which protects outlier
//       channels.
//       A token group is quantized only once all `group_tokens` of its tokens
//       exist; until then the sequence keeps them in full precision in its
//       residual (SeqChunk::residual), so the up to group_tokens-1 most recent
//       tokens are always exact. group_tokens divides block_size.
//   Quantized K area of one block and layer, channel keys:
//     per token group: scale [kvdim] fp16, min [kvdim] fp16, q [G, row_q_bytes]
//   token keys and all values:
//     per token: scale [n_cgroups] fp16, min [n_cgroups] fp16, q [row_q_bytes]
//   row_q_bytes = kvdim (int8) or kvdim / 2 (int4: element 2i in the low
//   nibble of byte i, 2i+1 in the high one).
#pragma once
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/kv_groups.h"

namespace kvs {

enum class KvType : uint8_t { F32, F16, BF16, Int8, Int4 };
enum class KeyScale : uint8_t { Channel, Token };

struct KvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  KvType type = KvType::F32;
  KeyScale key_scale = KeyScale::Channel;
  int group_tokens = 16;    // quantized types: tokens per key group and per residual
  int group_channels = 32;  // quantized types: row elements per (scale, min)
  // Which table and slot each layer uses; empty: one table, slot = layer.
  KvGroups groups;

  int slots() const { return groups.tables.empty() ? n_layers : groups.slots; }  // layer slots per block
  int n_tables() const { return groups.tables.empty() ? 1 : groups.n_tables(); }
  int table_of(int layer) const { return groups.tables.empty() ? 0 : groups.table_of[size_t(layer)]; }
  int slot_of(int layer) const { return groups.tables.empty() ? layer : groups.slot_of[size_t(layer)]; }

  bool quantized() const { return type == KvType::Int8 || type == KvType::Int4; }
  int kvdim() const { return n_kv_heads * head_dim; }
  size_t row_floats() const { return size_t(n_kv_heads) * head_dim; }  // one token, one layer, K or V
  int n_cgroups() const { return (kvdim() + group_channels - 1) / group_channels; }
  size_t elem_bytes() const { return type == KvType::F32 ? 4 : 2; }  // unquantized types
  size_t row_q_bytes() const { return type == KvType::Int8 ? size_t(kvdim()) : size_t(kvdim()) / 2; }
  // One quantized per-token row, metadata included.
  size_t token_row_bytes() const { return size_t(n_cgroups()) * 4 + row_q_bytes(); }
  // One quantized per-channel key group (group_tokens rows), metadata included.
  size_t channel_group_bytes() const { return size_t(kvdim()) * 4 + size_t(group_tokens) * row_q_bytes(); }
  size_t k_area_bytes() const {
    if (!quantized()) return size_t(block_size) * row_floats() * elem_bytes();
    if (key_scale == KeyScale::Channel) return size_t(block_size / group_tokens) * channel_group_bytes();
    return size_t(block_size) * token_row_bytes();
  }
  size_t v_area_bytes() const {
    if (!quantized()) return size_t(block_size) * row_floats() * elem_bytes();
    return size_t(block_size) * token_row_bytes();
  }
  size_t layer_bytes() const { return k_area_bytes() + v_area_bytes(); }
  size_t block_bytes() const { return size_t(slots()) * layer_bytes(); }
  // One token in every table (padded slots included), averaged over full
  // blocks (a quantized block's metadata included). A windowed table holds
  // only its window's tokens: see kv/capacity.h for what a sequence costs.
  double bytes_per_token_avg() const { return double(block_bytes()) * n_tables() / block_size; }
  // Exact for f32/f16/bf16 (every token costs the same), every table.
  size_t bytes_per_token() const { return 2 * size_t(slots()) * n_tables() * row_floats() * elem_bytes(); }
  // Floats of one sequence's full-precision residual: K and V of up to
  // group_tokens tokens for every layer ([n_layers, 2, G, kvdim]); 0 when the
  // type needs none.
  size_t residual_floats() const {
    return quantized() ? size_t(n_layers) * 2 * size_t(group_tokens) * row_floats() : 0;
  }
  // Throws std::invalid_argument naming the rule that a layout breaks.
  void validate() const;
  std::string describe() const;  // "int4 keys/channel g16, values/token c32"
};

// Read/write view of the block storage (owned by BlockStorage).
struct KvStorage {
  uint8_t* base = nullptr;  // [n_blocks, block_bytes]
  KvLayout layout;
  int64_t n_blocks = 0;
  // `slot`: the layer's slot in its table's blocks (KvLayout::slot_of; the
  // layer itself with one table).
  uint8_t* k_area(int32_t block, int slot) const {
    return base + size_t(block) * layout.block_bytes() + size_t(slot) * layout.layer_bytes();
  }
  uint8_t* v_area(int32_t block, int layer) const { return k_area(block, layer) + layout.k_area_bytes(); }
  // F32 only: K / V row of (block, layer, slot): [n_kv_heads, head_dim]
  float* k(int32_t block, int layer, int slot) const {
    assert(layout.type == KvType::F32);
    return reinterpret_cast<float*>(k_area(block, layer)) + size_t(slot) * layout.row_floats();
  }
  float* v(int32_t block, int layer, int slot) const {
    assert(layout.type == KvType::F32);
    return reinterpret_cast<float*>(v_area(block, layer)) + size_t(slot) * layout.row_floats();
  }
};

// "f32" | "f16" | "bf16" | "int8" | "int4"; throws naming the spellings.
KvType parse_kv_type(const std::string& s);
const char* to_string(KvType t);
// "channel" | "token".
KeyScale parse_key_scale(const std::string& s);
const char* to_string(KeyScale k);

}  // namespace kvs
