// Which KV table, and which layer slot of that table's blocks, each layer
// uses: the hybrid KV cache. Plain data computed once per model.
//
// Layers with the same window (kvserve's layers share one attention shape)
// form a group. All blocks of the one pool are the same size, so every
// block has S layer slots, S = the smallest group's layer count, and each
// group is cut into ceil(n_g / S) tables of S slots (the last one padded,
// as vLLM's hybrid allocator does). A sequence holds one block table per
// KV table; a block of table t holds K/V of table t's layers for its token
// slots. Full-attention tables come first, so table 0 is a full-attention
// table whenever the model has one (its block keys are the chain keys the
// router and the KV events use).
//
// A model whose layers all share one window has exactly one table with
// S = n_layers: the block is then every layer's K and V, as it always was.
//
//   Gemma 2 shape, 4 layers, windows {W, 0, W, 0}: S = 2,
//     table 0: window 0, layers {1, 3};  table 1: window W, layers {0, 2}
//   Gemma 3 shape, 6 layers, 5 local : 1 global: S = 1, six tables,
//     table 0: layer 5 (global);  tables 1..5: layers 0..4 (window W)
#pragma once
#include <string>
#include <vector>

namespace kvs {

struct KvGroups {
  struct Table {
    int window = 0;           // its layers' sliding window (0: they see the whole context)
    std::vector<int> layers;  // model layer of each used slot, ascending (<= slots of them)
    bool operator==(const Table&) const = default;
  };
  int n_layers = 0;
  int slots = 0;                // S: layer slots per block
  std::vector<Table> tables;    // full-attention tables first, then by window
  std::vector<int> table_of;    // [n_layers] table of each layer
  std::vector<int> slot_of;     // [n_layers] its slot in that table's blocks

  // One table of every layer, with that window (the cache as it always was).
  static KvGroups uniform(int n_layers, int window = 0);
  // Grouped by window (layer_window[l], 0 = whole context); uniform() when
  // every layer has the same one. Throws std::invalid_argument when empty
  // or a window is negative.
  static KvGroups by_window(const std::vector<int>& layer_window);

  int n_tables() const { return int(tables.size()); }
  bool hybrid() const { return tables.size() > 1; }
  std::vector<int> table_windows() const;  // [n_tables]
  // "3 tables x 2 slots: w0 {1,3} | w16 {0,2} | w16 {4}": the grouping, for
  // layout identities (tiers, transfers, saved sequences) and logs.
  std::string describe() const;
  bool operator==(const KvGroups&) const = default;
};

}  // namespace kvs
