#include "tools/bench_roofline.h"

#include <algorithm>

#include "kernels/cpu.h"
#include "tools/plan.h"

namespace kvs::tools {

namespace {
// The point measured at `threads`, else the best over all thread counts.
double at_threads(const std::vector<RatePoint>& pts, double best, int threads) {
  for (const RatePoint& p : pts)
    if (p.threads == threads) return p.rate;
  return best;
}
}  // namespace

BenchRoofline bench_roofline(const HardwareProfile& p, const std::string& source, int threads,
                             MatmulPrecision precision) {
  BenchRoofline r;
  r.source = source;
  r.bandwidth = at_threads(p.bandwidth_by_threads, p.bandwidth, threads);
  // The int8 path that runs: AMX tiles where they are in use and measured.
  r.int8_tiles = active_isa() == Isa::Amx && p.int8_amx.peak > 0;
  const PeakRate& int8 = r.int8_tiles ? p.int8_amx : p.int8;
  r.peak_int8 = at_threads(int8.by_threads, int8.peak, threads);
  r.peak_fp32 = at_threads(p.fp32.by_threads, p.fp32.peak, threads);
  // (An AMX profile from before fp32_amx was measured: the idle FMA rate.)
  const PeakRate& chain = r.int8_tiles && p.fp32_amx.peak > 0 ? p.fp32_amx : p.fp32;
  r.peak_chain = at_threads(chain.by_threads, chain.peak, threads);
  r.bf16_matmuls = precision == MatmulPrecision::Bf16;
  r.peak_bf16_amx = at_threads(p.bf16_amx.by_threads, p.bf16_amx.peak, threads);
  return r;
}

PrefillOps prefill_ops_per_token(const Model& m, int n_prompt) {
  PrefillOps o;
  if (n_prompt <= 0) return o;
  auto add = [&](const WeightView& w, double share) {
    const double ops = 2.0 * double(w.rows) * double(w.cols) * share;
    (compute_path_for_type(type_name(w.type)) == "fp32" ? o.fp32 : o.int8) += ops;
    o.chain += double(w.rows) * double(w.cols) / 32.0 * share * chain_ops_per_block(w.type);
  };
  const ModelWeights& w = m.weights();
  const MoeConfig& moe = m.config().moe;
  for (const LayerWeights& l : w.layers) {
    for (const WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) add(*v, 1.0);
    if (moe.n_expert == 0) continue;
    for (const WeightView* v : {&l.moe.router, &l.moe.sh_gate, &l.moe.sh_up, &l.moe.sh_down}) add(*v, 1.0);
    for (const auto* e : {&l.moe.gate, &l.moe.up, &l.moe.down}) add(e->front(), double(moe.n_used));
  }
  add(w.output, 1.0 / n_prompt);
  // QKᵀ and P·V: 4 · heads · head_dim per key; token i sees i keys.
  const ModelConfig& c = m.config();
  o.attention = 4.0 * c.n_layers * c.n_heads * c.head_dim * (n_prompt + 1) / 2.0;
  return o;
}

double decode_weight_bytes(const Model& m) {
  const ModelConfig& c = m.config();
  const double embd = double(m.weights().tok_embd.row_stride) * c.n_vocab;
  double bytes = double(c.weight_bytes) - (c.tied_output ? 0 : embd);
  if (c.moe.n_expert > 0)
    for (const LayerWeights& l : m.weights().layers)
      for (const auto* e : {&l.moe.gate, &l.moe.up, &l.moe.down})
        bytes -= double(c.moe.n_expert - c.moe.n_used) * double(e->front().rows) * double(e->front().row_stride);
  return bytes;
}

double prefill_roofline_seconds(const PrefillOps& ops, const BenchRoofline& r) {
  const double peak_float = r.bf16_matmuls ? r.peak_bf16_amx : r.peak_fp32;
  if ((ops.int8 > 0 && r.peak_int8 <= 0) || (ops.chain > 0 && r.peak_chain <= 0) ||
      (ops.fp32 > 0 && peak_float <= 0) || (ops.attention > 0 && r.peak_fp32 <= 0))
    return 0;
  double t = 0;
  const double dots = ops.int8 > 0 ? ops.int8 / r.peak_int8 : 0;
  const double chain = ops.chain > 0 ? 2.0 * ops.chain / r.peak_chain : 0;  // an FMA's slot each
  t += r.int8_tiles ? std::max(dots, chain) : dots + chain;
  if (ops.fp32 > 0) t += ops.fp32 / peak_float;
  if (ops.attention > 0) t += ops.attention / r.peak_fp32;
  return t;
}

}  // namespace kvs::tools
