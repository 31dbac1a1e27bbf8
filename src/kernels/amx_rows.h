// When the AMX tile kernels run: per weight type, the smallest number of
// activation rows n from which a quantized matmul on Panel16 weights uses
// tiles (matmul_amx.cpp) instead of the AVX-512 VNNI kernels.
//
// Tiles pay only from some n on: below it the per-block tile loads and the
// weight slice copy cost more than the VNNI dot products they replace, and at
// n = 1 the product is memory bound anyway. Where the crossover lies depends
// on the CPU, so `kvserve probe` times both paths and stores the choice in
// the profile (tools/kernel_choice.h); until one is applied the built-in
// default holds. Both paths compute the same bits, so the choice is speed only.
#pragma once
#include <cstdint>

#include "kernels/matmul.h"
#include "kernels/quant.h"

namespace kvs {

// n value meaning "never use tiles for this type".
constexpr int kAmxNever = 1 << 30;

// Q8_0, Q4_0, MXFP4, Q4_K, Q5_K, Q6_K: the types with AMX kernels (on their Panel16 copy).
bool amx_tile_type(GgmlType t);
// The built-in threshold for t (kAmxNever for types without AMX kernels).
int default_amx_min_rows(GgmlType t);
// The threshold in force for t: the default until set.
int amx_min_rows(GgmlType t);
// n in [1, kAmxNever]; throws std::invalid_argument otherwise or for a type
// without AMX kernels.
void set_amx_min_rows(GgmlType t, int n);
void reset_amx_min_rows();

// Whether the AMX kernels take w at n rows when the ISA is Isa::Amx: a
// Panel16 copy of an AMX type and n >= its threshold.
bool amx_tiles_apply(const WeightView& w, int64_t n);
// Whether matmul() runs w at n rows on tiles now (the active ISA included).
bool amx_tiles_run(const WeightView& w, int64_t n);

}  // namespace kvs
