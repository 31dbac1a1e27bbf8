// What `kvserve bench` sets its results against: the probe's measured read
// bandwidth and peak arithmetic rates (at the bench's thread count), and the
// work one token costs in this model.
//
//   decode:  bytes read per token × tok/s  vs  bandwidth
//   prefill: per token, matmul ops on the int8 path (quantized weights, VNNI
//            or, where they run, AMX tiles: the profile's int8_amx peak)
//            and on the fp32 path (float weights, FMA; with bf16 matmuls
//            the AMX-BF16 tiles: the profile's bf16_amx peak) plus
//            attention ops (fp32); the roofline time is Σ ops / peak of their path, and
//            the fraction of peak is that time ÷ the measured time. The
//            int8 path also pays its exact float chain (chain_ops_per_block
//            vector operations per output and block, each an FMA's issue
//            slot): after the VNNI dots on the same vector unit, or beside
//            the AMX tiles at the FMA rate measured while tiles run
//            (fp32_amx), whichever of the two units takes longer.
#pragma once
#include <string>

#include "model/model.h"
#include "tools/probe.h"

namespace kvs::tools {

struct BenchRoofline {
  std::string source;    // the profile's path; empty: no profile (no roofline)
  double bandwidth = 0;  // bytes/s at the bench's threads (best over threads if not measured there)
  double peak_int8 = 0, peak_fp32 = 0;  // ops/s, likewise
  // MatmulPrecision::Bf16: float-weight products run on AMX-BF16 tiles, at
  // peak_bf16_amx (0 where the profile has none: then no roofline).
  bool bf16_matmuls = false;
  double peak_bf16_amx = 0;
  // The int8 path's float chain: FMA ops/s (fp32_amx beside AMX tiles,
  // else fp32), and whether it runs beside tiles (overlapping them) or after
  // the VNNI dots.
  double peak_chain = 0;
  bool int8_tiles = false;
};
BenchRoofline bench_roofline(const HardwareProfile& p, const std::string& source, int threads,
                             MatmulPrecision precision = MatmulPrecision::Fp32);

// Ops per prompt token of an n_prompt-token prefill that returns the last
// token's logits only (the output matrix runs once per prompt).
struct PrefillOps {
  double int8 = 0, fp32 = 0, attention = 0;
  double chain = 0;  // vector operations of the int8 path's float chain (not counted in total)
  double total() const { return int8 + fp32 + attention; }
};
// A mixture-of-experts layer counts its router, the k experts a token runs
// and the shared expert.
PrefillOps prefill_ops_per_token(const Model& m, int n_prompt);

// Weight bytes one decode token reads: every matrix but the embedding table
// (one row of it), and of a MoE layer's experts only the k it runs.
double decode_weight_bytes(const Model& m);

// Seconds per token at the peaks; 0 when a needed peak is unknown.
double prefill_roofline_seconds(const PrefillOps& ops, const BenchRoofline& r);

}  // namespace kvs::tools
