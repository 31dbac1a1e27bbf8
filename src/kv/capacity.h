// KV-cache sizing and admission capacity: the one estimate shared by
// `kvserve plan` (before buying hardware) and the scheduler's admission
// controller (before accepting a request). Plain data in, plain data out; no
// model loading. All arithmetic is exact integer arithmetic with overflow
// checks, so the planner and the server can never disagree by a rounding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

enum class KvDtype { F32, F16, BF16, Int8, Int4 };

// How one K or V row (head_dim elements of one kv head, one layer, one
// token) is stored. Quantized formats carry per-group metadata: int8 has
// one fp16 scale per group, int4 one fp16 scale plus one fp16 min per group
// (asymmetric, like ggml's Q4_1), because 4 bits are too few to be useful
// symmetrically around an outlier-heavy distribution. A row's last group
// may be partial and still pays a full scale.
struct KvFormat {
  KvDtype dtype = KvDtype::F16;
  int group_size = 32;  // elements sharing one scale (quantized formats only)

  static KvFormat f32() { return {KvDtype::F32, 0}; }
  static KvFormat f16() { return {KvDtype::F16, 0}; }
  static KvFormat bf16() { return {KvDtype::BF16, 0}; }
  static KvFormat int8(int group = 32) { return {KvDtype::Int8, group}; }
  static KvFormat int4(int group = 32) { return {KvDtype::Int4, group}; }

  bool quantized() const { return dtype == KvDtype::Int8 || dtype == KvDtype::Int4; }
  int bits_per_element() const;          // payload bits only: 32/16/16/8/4
  int metadata_bytes_per_group() const;  // 0 / 0 / 0 / 2 / 4
  // Bytes of one row of `n` elements, metadata included (throws on n < 1).
  size_t row_bytes(int64_t n) const;
  std::string name() const;  // "f16", "int8/g32", ...
};

// Parses "f32", "f16", "bf16", "int8", "int4" (also "q8"/"q4"), optionally
// followed by "/gN" or ":N" for the group size; throws std::invalid_argument
// naming the accepted spellings.
KvFormat parse_kv_format(const std::string& s);
// The formats the planner reports side by side (f16, bf16, int8, int4 at
// the default group size; f32 too because the engine's cache is f32 today).
std::vector<KvFormat> standard_kv_formats();

// Bytes of K and V for one token across every layer:
//   2 × layers × kv_heads × row_bytes(head_dim)
// e.g. Llama-2-70B at f16: 2 × 80 × 8 × 128 × 2 = 327,680 B.
size_t kv_bytes_per_token(int n_layers, int n_kv_heads, int head_dim, KvFormat fmt);

// ceil(tokens / block_size); tokens >= 0, block_size >= 1.
int64_t blocks_for_tokens(int64_t tokens, int block_size);

// Worst-case blocks a request can ever hold: its prompt plus every token it
// may generate, less the prompt blocks already resident in the prefix cache
// (those are shared, not allocated). Only whole prompt blocks can be shared,
// so cached_prefix_blocks may not exceed floor(prompt_tokens / block_size).
int64_t request_blocks(int64_t prompt_tokens, int64_t max_tokens, int block_size,
                       int64_t cached_prefix_blocks = 0);

// Blocks held back from admission so running sequences can grow and the
// prefix cache keeps some room: ceil(total × fraction), where the fraction is
// taken in whole parts per million (0.05 -> 50,000 ppm) so the result is
// exact. fraction must be in [0, 1).
int64_t headroom_blocks(int64_t total_blocks, double headroom_fraction);

// One KV table of the hybrid cache (kernels/kv_groups.h) as sizing sees
// it: the layer slots of its blocks and its layers' window (0 = the whole
// context).
struct KvTableShape {
  int slots = 0;
  int window = 0;
};

// The tables of a model whose layer l has window layer_window[l]
// (KvGroups::by_window); empty windows: one table of n_layers slots.
std::vector<KvTableShape> kv_table_shapes(const std::vector<int>& layer_window, int n_layers);

// Blocks one sequence of `tokens` tokens holds in a table: every one, or in
// a windowed table at most ceil(window / block_size) + 1 between steps
// (max_step_tokens = 0), or window_block_cap's bound when a step appends up
// to max_step_tokens tokens (what admission reserves).
int64_t table_blocks(const KvTableShape& t, int64_t tokens, int block_size, int max_step_tokens);

// K/V bytes of one sequence of `tokens` tokens over these tables: Σ
// table_blocks × slots × block_size × layer_token_bytes (the bytes of one
// token's K and V in one layer).
uint64_t sequence_kv_bytes(const std::vector<KvTableShape>& tables, int64_t tokens, int block_size,
                           uint64_t layer_token_bytes, int max_step_tokens);

struct CapacityInput {
  uint64_t mem_budget_bytes = 0;   // everything the server may use
  uint64_t weight_bytes = 0;       // weights as resident in memory
  uint64_t scratch_bytes = 0;      // activations, logits, kernel workspaces
  double headroom_fraction = 0.05; // of the KV blocks, kept free
  int block_size = 16;             // token slots per block
  uint64_t kv_bytes_per_token = 0; // from kv_bytes_per_token()
  int64_t prompt_tokens = 0;       // per request, worst case
  int64_t max_tokens = 0;          // generation limit per request
  int64_t cached_prefix_blocks = 0;  // prompt blocks expected from the prefix cache
  // The hybrid cache: its KV tables (empty: one table of every layer, sized
  // by kv_bytes_per_token). With tables a block holds tables[0].slots layers
  // (bytes_per_block = block_size × slots × layer_token_bytes) and a
  // request's blocks are summed over the tables, a windowed one bounded by
  // table_blocks at max_step_tokens.
  std::vector<KvTableShape> tables;
  uint64_t layer_token_bytes = 0;
  int max_step_tokens = 512;
};

struct CapacityResult {
  uint64_t bytes_per_block = 0;      // block_size × kv_bytes_per_token
  uint64_t kv_budget_bytes = 0;      // budget − weights − scratch
  int64_t total_blocks = 0;          // floor(kv_budget / bytes_per_block)
  int64_t headroom_blocks = 0;       // ceil(total × headroom)
  int64_t usable_blocks = 0;         // total − headroom: what admission may promise
  int64_t blocks_per_request = 0;    // request_blocks(prompt, max_tokens, ...)
  int64_t max_concurrent_sequences = 0;  // floor(usable / blocks_per_request)
  int64_t max_tokens_resident = 0;   // usable × block_size (one very long sequence); -1: unbounded
                                     // (every table windowed)
};

// Throws std::invalid_argument when the budget cannot hold the weights and
// scratch (naming all three sizes) or when an input is out of range.
CapacityResult estimate_capacity(const CapacityInput& in);

}  // namespace kvs
