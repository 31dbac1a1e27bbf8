// One forward step's batch, flattened once before the layer loop: the
// sequence and position of every token row, the keys each row sees, how rows
// group into attention query blocks, where a quantized cache stages each
// chunk's open token groups, and which rows produce logits. Plain data; the
// layer loop only reads it. Built per step into reused buffers.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/kv_layout.h"
#include "kv/window_policy.h"
#include "kvserve/engine.h"

namespace kvs {

struct ModelConfig;

// One chunk of the batch as the layer loop needs it.
struct ChunkPlan {
  const int32_t* const* tables = nullptr;  // [n_tables] the block table of each KV table (SeqChunk::block_tables)
  int pos0 = 0;                          // tokens of the sequence already cached
  const int32_t* tokens = nullptr;       // [n_tokens], ids checked against the vocabulary
  int n_tokens = 0;
  int64_t row0 = 0;                      // the chunk's first token row
  float* residual = nullptr;             // quantized cache: SeqChunk::residual
  int64_t stage_row0 = 0;                // quantized cache: first staged row (its first group's start)
  bool rotates = false;                  // keys stored before RoPE, rotated at attention time
};

struct BatchPlan {
  int64_t n_tokens = 0;  // token rows T, in batch order
  std::vector<ChunkPlan> chunks;
  std::vector<int32_t> pos;       // [T] text index of each row in its sequence
  std::vector<int32_t> chunk_of;  // [T] chunk of each row
  std::vector<WindowView> view;   // [T] keys each row sees (WindowPolicy::view)
  // Query blocks (first row, rows), each inside one chunk: consecutive rows
  // that share every loaded K/V tile (kernels/attention.h).
  std::vector<std::pair<int64_t, int>> attn_blocks;
  std::vector<int64_t> out_rows;  // rows whose logits are wanted, in output order
  int max_key_pos = -1;           // highest RoPE position of a key rotated at attention time; -1: none
  int max_block_rows = 1;         // rows of the longest query block
  int64_t stage_rows = 0;         // quantized cache: staged rows of all chunks
};

// Fills `plan` for `batch`. Throws std::invalid_argument for an empty or
// malformed chunk, a chunk without its tables of a hybrid cache, a token id outside the vocabulary, a missing residual of a
// quantized cache, or a chunk without the window policy the model declares.
void plan_batch(const std::vector<SeqChunk>& batch, const ModelConfig& c, const KvLayout& layout, BatchPlan& plan);

}  // namespace kvs
