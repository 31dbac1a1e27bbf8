#include "engine/batch_plan.h"

#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>

#include "model/model.h"
#include "tokenizer/vocab.h"

namespace kvs {

namespace {

const WindowPolicy kAllVisible{};

// Per chunk: checks, its first row, whether its keys rotate at attention
// time, and (quantized cache) where its open groups are staged.
void plan_chunks(const std::vector<SeqChunk>& batch, const ModelConfig& c, const KvLayout& layout, BatchPlan& p) {
  p.chunks.clear();
  p.n_tokens = 0;
  p.stage_rows = 0;
  for (const SeqChunk& ch : batch) {
    if (ch.n_tokens < 1 || ch.pos0 < 0 || (!ch.block_table && !ch.block_tables) || !ch.tokens)
      throw std::invalid_argument("Engine::forward: empty or malformed chunk");
    // The policy is resolved once, when the sequence starts; a chunk without
    // it would silently ignore the model's own window.
    if (c.sliding_window > 0 && (!ch.window || !ch.window->active()))
      throw std::invalid_argument("Engine::forward: the model declares a sliding window; give each chunk its "
                                  "sequence's window policy (WindowPolicy::in_force)");
    if (layout.n_tables() > 1 && !ch.block_tables)
      throw std::invalid_argument("Engine::forward: a hybrid KV cache (" + std::to_string(layout.n_tables()) +
                                  " tables) needs each chunk's block tables");
    if (layout.quantized() && !ch.residual)
      throw std::invalid_argument("Engine::forward: a quantized KV cache needs each chunk's residual");
    if (std::string e = token_ids_error({ch.tokens, size_t(ch.n_tokens)}, c.n_vocab, "Engine::forward:"); !e.empty())
      throw std::invalid_argument(e);
    const int32_t* const* tables = ch.block_tables ? ch.block_tables : &ch.block_table;
    ChunkPlan cp{tables, ch.pos0, ch.tokens, ch.n_tokens, p.n_tokens, ch.residual, p.stage_rows,
                 ch.window && ch.window->rotates()};
    // A quantized cache stores a token group only once it is complete: the
    // chunk's rows are staged after the residual rows of its first group.
    if (layout.quantized()) p.stage_rows += ch.pos0 % layout.group_tokens + ch.n_tokens;
    p.chunks.push_back(cp);
    p.n_tokens += ch.n_tokens;
  }
}

// Per row: position, chunk, visible keys; the highest position a key rotated at attention time takes.
void plan_rows(const std::vector<SeqChunk>& batch, BatchPlan& p) {
  p.pos.resize(size_t(p.n_tokens));
  p.chunk_of.resize(size_t(p.n_tokens));
  p.view.resize(size_t(p.n_tokens));
  p.max_key_pos = -1;
  int64_t t = 0;
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    const WindowPolicy& w = batch[ci].window ? *batch[ci].window : kAllVisible;
    const bool rotates = p.chunks[ci].rotates;
    for (int i = 0; i < batch[ci].n_tokens; ++i, ++t) {
      const int pos = batch[ci].pos0 + i;
      const WindowView v = w.view(pos);
      p.pos[size_t(t)] = pos;
      p.chunk_of[size_t(t)] = int32_t(ci);
      p.view[size_t(t)] = v;
      if (rotates) p.max_key_pos = std::max(p.max_key_pos, pos - v.shift);
    }
  }
}

// Query blocks: consecutive tokens of a chunk share each loaded K/V tile (a
// long prefill re-read, and for int8/int4 dequantized, the whole cache per
// token). Only where every token sees all keys before it, unrotated; with a
// quantized cache a block stays inside one token group, so its tokens share
// the stored groups and the open group's rows. Else one token per block.
// Attention keeps no score rows (kernels/flash_attention.h), so the block
// size does not depend on the context length: the larger the block, the
// fewer passes over the cache, until its rows' state leaves L2.
void plan_query_blocks(const KvLayout& layout, BatchPlan& p) {
  const int tb_max = 64;
  const int G = layout.quantized() ? layout.group_tokens : 0;
  p.attn_blocks.clear();
  for (const ChunkPlan& ch : p.chunks) {
    const int64_t t = ch.row0;
    const int n = ch.n_tokens;
    bool whole = !ch.rotates;
    for (int i = 0; i < n && whole; ++i) whole = p.view[size_t(t + i)].sink_end >= p.view[size_t(t + i)].win_start;
    const int tb = whole ? tb_max : 1;
    for (int i = 0; i < n;) {
      int len = std::min(tb, n - i);
      if (G > 0) len = std::min(len, G - (ch.pos0 + i) % G);  // up to the group's end
      p.attn_blocks.push_back({t + i, len});
      i += len;
    }
  }
  p.max_block_rows = 1;
  for (const auto& b : p.attn_blocks) p.max_block_rows = std::max(p.max_block_rows, b.second);
}

// Logits rows: every row of a chunk with all_logits, else its last.
void plan_outputs(const std::vector<SeqChunk>& batch, BatchPlan& p) {
  p.out_rows.clear();
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    const ChunkPlan& ch = p.chunks[ci];
    for (int i = batch[ci].all_logits ? 0 : ch.n_tokens - 1; i < ch.n_tokens; ++i) p.out_rows.push_back(ch.row0 + i);
  }
}

}  // namespace

void plan_batch(const std::vector<SeqChunk>& batch, const ModelConfig& c, const KvLayout& layout, BatchPlan& plan) {
  plan_chunks(batch, c, layout, plan);
  plan_rows(batch, plan);
  plan_query_blocks(layout, plan);
  plan_outputs(batch, plan);
}

}  // namespace kvs
