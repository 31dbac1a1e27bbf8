// Reading and writing K/V rows in the block storage in every --kv-type
// (layout in kernels/kv_layout.h). The attention kernel reads through load_k /
// load_v one block tile at a time, so a quantized cache is dequantized only
// tile by tile, never copied whole. `layer` is the layer's slot in its KV
// table's blocks (KvLayout::slot_of; the layer itself with one table), as
// in attention.h.
#pragma once
#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvs::kvc {

// f32 / f16 / bf16: n token rows of K and V ([n, kvdim] each, row stride
// kvdim) into slots slot0 .. slot0+n-1 of (block, layer).
void store_rows(const KvStorage& kv, int32_t block, int layer, int slot0, int n, const float* k, const float* v);

// int8 / int4: one complete token group (group_tokens rows of K and V, [G,
// kvdim] each) into slots slot0 .. slot0+G-1; slot0 is a multiple of G.
void store_group(const KvStorage& kv, int32_t block, int layer, int slot0, const float* k, const float* v);

// Rows of kv head `g` for slots slot0 .. slot0+n-1 of (block, layer) as
// floats: out [n, head_dim]. Quantized slots must belong to stored groups.
void load_k(const KvStorage& kv, int32_t block, int layer, int g, int slot0, int n, float* out);
void load_v(const KvStorage& kv, int32_t block, int layer, int g, int slot0, int n, float* out);

// Asks the cache for the bytes load_k and load_v of the same rows will read
// (a software prefetch: no fault, no effect on results).
void prefetch_rows(const KvStorage& kv, int32_t block, int layer, int g, int slot0, int n);

// Asymmetric quantization of n values x[i * stride] to `bits` (8 or 4):
// scale and min are stored as fp16 and the codes are computed against the
// rounded values, so x ≈ min + scale * code with |error| <= scale / 2 (plus
// fp16 rounding of min). Codes go to code[i] (one per byte, unpacked).
void quantize_asym(const float* x, int n, int stride, int bits, uint16_t* scale, uint16_t* min, uint8_t* code);

}  // namespace kvs::kvc
