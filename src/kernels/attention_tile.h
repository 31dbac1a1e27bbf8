// One key tile of the tiled attention (flash_attention.h): the K and V rows
// of positions p0 .. p0 + kTile - 1 of kv head g, read in place through the
// block table (dequantized from the cache's type, the residual group's rows
// from the sequence's float rows, keys rotated to their RoPE position when
// they are stored before RoPE). Only one tile is ever held, never the
// sequence's K/V.
#pragma once
#include "kernels/attention.h"

namespace kvs {

// k, v: [kTile, head_dim]. Bit t of `rows` set: position p0 + t is loaded
// (it must be < seq.n_ctx and visible); the other rows are zero (their
// blocks may be gone under a window).
void load_attention_tile(const KvStorage& kv, int layer, const AttnSeq& seq, int g, int p0, unsigned rows, float* k,
                         float* v);

// Prefetches the stored rows of the tile at p0 (what load_attention_tile
// will read from the block storage), skipping blocks that are gone.
void prefetch_attention_tile(const KvStorage& kv, int layer, const AttnSeq& seq, int g, int p0);

}  // namespace kvs
