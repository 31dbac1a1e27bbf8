// Human-readable rendering of a plan (text table) and its SVG plots. Kept
// apart from plan.cpp so the arithmetic stays short enough to audit.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "tools/plan.h"
#include "tools/plot_svg.h"
#include "tools/units.h"

namespace kvs::tools {
namespace {

std::string pad(const std::string& s, size_t w, bool right = true) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

std::string num(double v, const char* f = "%.1f") {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Rates: 3 significant digits below 1000, whole numbers with separators above.
std::string rate(double v) { return v >= 1000 ? format_int(std::llround(v)) : num(v, "%.3g"); }

std::string ctx_str(double c) { return format_int(int64_t(std::ceil(c))); }

// 0.0123 -> "12.3 ms", 70.7 -> "70.7 s": durations at a readable scale.
std::string duration(double s) {
  if (s >= 1) return num(s, s >= 100 ? "%.0f s" : "%.3g s");
  const double ms = s * 1e3;
  if (ms >= 1) return num(ms, ms >= 100 ? "%.0f ms" : "%.3g ms");
  return num(ms * 1e3, "%.3g us");
}

// Largest batch of `ctx`-token sequences whose blocks fit the usable KV
// blocks; unbounded (INT64_MAX) when the capacity is unknown.
int64_t max_fitting_batch(const PlanResult& p, int64_t ctx) {
  if (!p.capacity_error.empty() || ctx <= 0) return INT64_MAX;
  return p.capacity.usable_blocks / sequence_blocks(p, ctx);
}

// The hybrid cache: its tables, and one sequence's bytes with every layer
// full size against its groups at their windows.
void format_hybrid(std::ostringstream& o, const PlanResult& p) {
  const HybridKv& h = p.hybrid;
  int full = 0;
  std::string windows;
  for (const KvTableShape& t : h.tables) {
    if (t.window == 0) ++full;
    else if (windows.find(" " + std::to_string(t.window) + ",") == std::string::npos)
      windows += " " + std::to_string(t.window) + ",";
  }
  o << "\nHybrid KV cache: " << h.tables.size() << " tables of " << h.tables[0].slots << " layer slots (" << full
    << " full-attention, " << h.tables.size() - size_t(full) << " windowed:" << windows.substr(0, windows.size() - 1)
    << " tokens), " << format_int(int64_t(h.layer_token_bytes)) << " B per token and layer (" << p.in.kv.name()
    << ")\n";
  o << "  " << pad("context", 9) << pad("every layer full", 18) << pad("hybrid", 12) << pad("saving", 9)
    << pad("admission bound", 17) << "  blocks (full / hybrid)\n";
  for (const HybridKvRow& r : h.rows)
    o << "  " << pad(format_int(r.ctx), 9) << pad(format_bytes(double(r.full_bytes)), 18)
      << pad(format_bytes(double(r.hybrid_bytes)), 12) << pad(num(r.saving, "%.2f") + "x", 9)
      << pad(format_bytes(double(r.bound_bytes)), 17) << "  " << format_int(r.full_blocks) << " of "
      << p.in.model.n_layers << " layers / " << format_int(r.hybrid_blocks) << " of " << h.tables[0].slots << "\n";
  o << "  hybrid: a windowed table holds ceil(window / " << p.in.block_size << ") + 1 blocks between steps; admission "
    << "reserves up to that plus a " << p.in.max_step_tokens << "-token step.\n";
}

}  // namespace

std::string format_plan(const PlanResult& p) {
  const ModelShape& m = p.in.model;
  const Hardware& hw = p.in.hw;
  std::ostringstream o;
  o << "Model      " << m.name << " (" << m.arch << ", " << (m.source == "preset" ? "preset" : m.source) << ")\n"
    << "           " << m.n_layers << " layers, " << m.n_heads << " heads / " << m.n_kv_heads << " KV heads x "
    << m.head_dim << ", dim " << m.dim << ", ";
  if (m.n_expert > 0) {
    o << m.n_expert << " experts";
    if (m.expert_ffn > 0) o << " of " << m.expert_ffn;
    o << " (" << m.n_expert_used << " per token)";
  } else {
    o << "ffn " << m.ffn_dim;
  }
  o << ", vocab " << m.n_vocab << ", trained context " << m.n_ctx << "\n";
  o << "Weights    " << m.weight_type << ": " << format_bytes(double(m.weight_bytes)) << " ("
    << format_int(int64_t(m.weight_bytes)) << " B), " << format_si(double(m.total_params), "") << " params; read per decode step: "
    << format_bytes(double(m.streamed_weight_bytes)) << "\n";
  o << "Hardware   memory " << (hw.mem_bytes ? format_bytes(double(hw.mem_bytes)) : "?") << ", read bandwidth "
    << (hw.bandwidth > 0 ? format_si(hw.bandwidth, "B/s") : "?") << ", peak " << p.compute_path << " "
    << (p.peak_ops > 0 ? format_si(p.peak_ops, "OP/s") : "?") << "  [" << hw.source << "]\n\n";

  o << "KV cache per token (K and V, every layer) and at batch " << p.in.batch << " x context " << p.in.ctx << "\n";
  o << "  " << pad("format", 10, false) << pad("bytes/token", 14) << pad("if MHA", 12) << pad("if MQA", 12)
    << pad("cache", 13) << "  cache = weights at context\n";
  for (const auto& f : p.formats) {
    const std::string mark = f.format == p.in.kv.name() ? "*" : " ";
    o << mark << " " << pad(f.format, 10, false) << pad(format_int(int64_t(f.bytes_per_token)), 14)
      << pad(format_int(int64_t(f.mha_bytes_per_token)), 12) << pad(format_int(int64_t(f.mqa_bytes_per_token)), 12)
      << pad(format_bytes(double(f.cache_bytes)), 13) << "  "
      << ctx_str(f.crossover_b1) + " (B=1), " + ctx_str(f.crossover_b32) + " (B=32)\n";
  }
  o << "  GQA saving: " << num(p.gqa_saving, "%.3g") << "x vs MHA (" << m.n_heads << " query heads share " << m.n_kv_heads
    << " KV heads); MQA would be " << num(double(p.kv_bytes_per_token) / double(p.mqa_bytes_per_token), "%.3g")
    << "x smaller still.\n";
  o << "  " << p.in.kv.name() << ": " << format_int(int64_t(p.kv_bytes_per_token)) << " B/token = "
    << format_bytes(double(p.kv_bytes_per_token)) << "; cache at B=" << p.in.batch << ", S=" << p.in.ctx << ": "
    << format_bytes(double(p.cache_bytes)) << "\n";
  for (const auto& c : p.crossovers)
    o << "  cache outgrows the weights at context " << format_int(c.context_tokens) << " for batch " << c.batch
      << (c.within_trained_context ? " (within the trained context)\n" : " (beyond the trained context)\n");

  if (!p.hybrid.tables.empty()) format_hybrid(o, p);

  const CapacityInput& ci = p.capacity_input;
  o << "\nCapacity (" << p.in.kv.name() << " KV, blocks of " << ci.block_size << " tokens, headroom "
    << num(ci.headroom_fraction * 100, "%.3g") << "%)\n";
  if (!p.capacity_error.empty()) {
    o << "  error: " << p.capacity_error << "\n";
  } else {
    const CapacityResult& c = p.capacity;
    o << "  budget " << format_bytes(double(ci.mem_budget_bytes)) << " - weights " << format_bytes(double(ci.weight_bytes))
      << " - scratch " << format_bytes(double(ci.scratch_bytes)) << " = " << format_bytes(double(c.kv_budget_bytes))
      << " for KV\n";
    o << "  " << format_int(c.total_blocks) << " blocks of " << format_bytes(double(c.bytes_per_block)) << ", "
      << format_int(c.headroom_blocks) << " held back, " << format_int(c.usable_blocks) << " usable ("
      << (c.max_tokens_resident < 0 ? std::string("unbounded: every layer windowed")
                                    : format_int(c.max_tokens_resident) + " tokens")
      << ")\n";
    o << "  per request: prompt " << ci.prompt_tokens << " + max_tokens " << ci.max_tokens << " = "
      << c.blocks_per_request << " blocks (worst case)\n";
    o << "  max concurrent sequences: " << format_int(c.max_concurrent_sequences) << "\n";
  }

  if (p.has_roofline) {
    o << "\nDecode roofline at context " << p.in.ctx << " (" << p.compute_path << " path"
      << (p.peak_ops > 0 ? ", ridge " + num(p.ridge_intensity, "%.3g") + " ops/B" : "") << ")\n";
    o << "  " << pad("batch", 6) << pad("weights", 12) << pad("KV read", 12) << pad("ops/B", 9) << pad("step", 10)
      << pad("tok/s", 11) << pad("bound", 9) << pad("fits", 6) << pad("exp. step", 11) << pad("exp. tok/s", 12)
      << "  expected limit\n";
    for (const auto& r : p.roofline)
      o << "  " << pad(std::to_string(r.batch), 6) << pad(format_bytes(r.weight_bytes), 12)
        << pad(format_bytes(r.kv_bytes), 12) << pad(num(r.intensity, "%.3g"), 9)
        << pad(duration(std::max(r.t_memory, r.t_compute)), 10) << pad(rate(r.tok_s), 11)
        << pad(r.memory_bound ? "memory" : "compute", 9) << pad(r.fits ? "yes" : "no", 6)
        << pad(duration(r.t_expected), 11) << pad(rate(r.tok_s_expected), 12) << "  " << r.limit << "\n";
    o << "  step / tok/s / bound: roofline ceiling (bandwidth and peak ops). exp.: "
      << (p.has_kernel_rates ? "measured kvs::matmul rates per weight type" : "roofline terms (no kernel rates in the profile)")
      << " summed with attention (max of K/V read and fp32 ops).\n";
    for (const auto& w : p.weight_mix)
      if (const KernelRate* k = hw.kernel(w.type)) {
        o << "  kernel " << w.type << " (" << format_bytes(w.bytes) << "):";
        for (const auto& q : k->points)
          o << " n=" << q.n << " " << format_si(q.ops_per_s, "OP/s") << " / " << format_si(q.weight_bytes_per_s, "B/s");
        o << "\n";
      }
    o << "  K/V reads overtake weight reads from batch " << p.kv_overtakes_batch << " at context " << p.in.ctx
      << ": past it, a bigger batch mostly buys more KV traffic, not more tokens per byte.\n";
    if (p.peak_ops > 0) {
      // As B grows the weights amortise away and the step's intensity tends to
      // one sequence's ops over its K/V bytes; below the ridge, no batch helps.
      const double S = double(p.in.ctx);
      const double limit = (2.0 * double(m.matmul_params) + 4.0 * m.n_layers * m.n_heads * m.head_dim * S) /
                           (S * double(p.kv_bytes_per_token));
      o << "  " << (p.compute_bound_batch > 0
                        ? "compute-bound from batch " + format_int(p.compute_bound_batch)
                        : "never compute-bound at this context: as the batch grows the step's intensity tends to " +
                              num(limit, "%.3g") + " ops/B (one sequence's ops per K/V byte), below the ridge")
        << "\n";
    }
    o << "  prefill of " << p.prefill.tokens << " tokens: " << format_si(p.prefill.ops, "OP") << ", ~"
      << duration(p.prefill.seconds) << " (" << rate(p.prefill.tok_s) << " tok/s, "
      << (p.prefill.compute_bound ? "compute" : "memory") << "-bound)\n";
    const TierReadEstimate& t = p.tier_read;
    if (t.tokens > 0 && p.prefill.seconds > 0) {
      auto vs = [&](double s) { return s > 0 ? num(p.prefill.seconds / s, "%.3g") + "x faster" : std::string("?"); };
      o << "  reloading its " << t.tokens << " tokens of K/V (" << format_si(t.bytes, "B") << ") from a KV tier instead: disk ~"
        << duration(t.disk_s) << " at " << format_si(p.in.disk_read_bps, "B/s") << " (" << vs(t.disk_s) << "), Redis ~"
        << duration(t.redis_s) << " at " << format_si(p.in.redis_read_bps, "B/s") << " (" << vs(t.redis_s) << ")\n";
    }
    const TransferEstimate& x = p.transfer;
    if (x.tokens > 0 && p.prefill.seconds > 0) {
      o << "  shipping its K/V to a decode worker: " << format_si(x.formula_bytes, "B") << " (" << x.tokens << " x "
        << format_si(double(p.kv_bytes_per_token), "B") << "), " << format_si(x.wire_bytes, "B")
        << " in whole blocks; ~" << duration(x.seconds) << " at " << format_si(p.in.link_bps, "B/s")
        << "; shipping beats recomputing above " << format_si(x.breakeven_bps, "B/s") << "\n";
    }
  }
  if (!p.notes.empty()) o << "\n";
  for (const auto& n : p.notes) o << "note: " << n << "\n";
  return o.str();
}

std::vector<std::string> write_plan_plots(const PlanResult& p, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  std::vector<std::string> out;
  const ModelShape& m = p.in.model;

  // 1. KV cache vs context against the weights.
  {
    Plot pl;
    pl.title = m.name + ": KV cache vs weights";
    pl.x_label = "context length (tokens per sequence)";
    pl.y_label = "bytes";
    pl.log_x = pl.log_y = pl.pow2_x = pl.pow2_y = true;
    pl.y_format = TickFormat::Bytes;
    pl.x_format = TickFormat::SI;
    const double w = double(m.weight_bytes);
    const double x_hi = std::max({double(m.n_ctx), 2.0 * p.crossovers[0].context, 4096.0});
    const KvFormat sel = p.in.kv;
    std::vector<std::pair<KvFormat, int64_t>> curves = {{KvFormat::f16(), 1}, {KvFormat::f16(), 32}};
    if (sel.name() != "f16") curves.insert(curves.begin(), {{sel, 1}, {sel, 32}});
    if (sel.name() != KvFormat::int4().name()) curves.push_back({KvFormat::int4(), 1});
    for (auto [f, b] : curves) {
      PlotSeries s;
      s.name = "KV " + f.name() + ", batch " + std::to_string(b);
      s.dashed = f.name() != sel.name();
      const double kpt = double(kv_bytes_per_token(m.n_layers, m.n_kv_heads, m.head_dim, f));
      for (double x = 16; x <= x_hi * 1.0001; x *= std::sqrt(2.0)) s.points.push_back({x, double(b) * x * kpt});
      pl.series.push_back(s);
    }
    pl.series.push_back({"weights (" + m.weight_type + ")", {{16, w}, {x_hi, w}}, "#000000", false, false});
    for (const auto& c : p.crossovers)
      pl.lines.push_back({double(c.context_tokens), true, "B=" + std::to_string(c.batch) + ": " + format_int(c.context_tokens),
                          "#d62728"});
    if (m.n_ctx > 0) pl.lines.push_back({double(m.n_ctx), true, "trained ctx " + format_int(m.n_ctx), "#777777"});
    pl.x_min = 16;
    pl.x_max = x_hi;
    const std::string path = (fs::path(dir) / "kv_vs_context.svg").string();
    pl.write(path);
    out.push_back(path);
  }
  if (!p.has_roofline) return out;

  // 2. Decode roofline: predicted tok/s vs batch with its two ceilings.
  {
    Plot pl;
    pl.title = m.name + ": decode tok/s vs batch (context " + std::to_string(p.in.ctx) + ", " + p.in.kv.name() + " KV)";
    pl.x_label = "batch size (sequences decoding together)";
    pl.y_label = "tokens / second (all sequences)";
    pl.log_x = pl.log_y = pl.pow2_x = true;
    pl.y_format = TickFormat::SI;
    PlotSeries pred{"predicted", {}, "#1f77b4", false, false}, mem{"memory roof", {}, "#2ca02c", true, false},
        wonly{"weights only (no KV)", {}, "#7f7f7f", true, false}, comp{"compute roof", {}, "#d62728", true, false};
    int64_t first_compute = 0;
    for (int64_t b = 1; b <= 256; ++b) {
      const RooflinePoint r = roofline_point(p, b, p.in.ctx);
      pred.points.push_back({double(b), r.tok_s});
      mem.points.push_back({double(b), double(b) / r.t_memory});
      wonly.points.push_back({double(b), double(b) * p.in.hw.bandwidth / r.weight_bytes});
      if (r.t_compute > 0) comp.points.push_back({double(b), double(b) / r.t_compute});
      if (!r.memory_bound && first_compute == 0) first_compute = b;
    }
    pl.series = {mem, wonly};
    if (!comp.points.empty()) pl.series.push_back(comp);
    pl.series.push_back(pred);  // drawn last, on top of the roofs it follows
    const double split = first_compute > 0 ? double(first_compute) : 256;
    pl.regions.push_back({1, split, "#2ca02c", "memory-bound"});
    if (first_compute > 0) pl.regions.push_back({split, 256, "#d62728", "compute-bound"});
    if (p.kv_overtakes_batch <= 256)
      pl.lines.push_back({double(p.kv_overtakes_batch), true, "KV reads > weight reads", "#9467bd"});
    if (const int64_t fit = max_fitting_batch(p, p.in.ctx); fit < 256)
      pl.lines.push_back({double(std::max<int64_t>(fit, 1)), true, "memory full at B=" + format_int(fit), "#000000"});
    pl.x_min = 1;
    pl.x_max = 256;
    const std::string path = (fs::path(dir) / "decode_roofline.svg").string();
    pl.write(path);
    out.push_back(path);
  }

  // 3. The same prediction at several contexts: longer contexts flatten the curve.
  {
    Plot pl;
    pl.title = m.name + ": predicted decode tok/s vs batch, by context";
    pl.x_label = "batch size";
    pl.y_label = "tokens / second (all sequences)";
    pl.log_x = pl.log_y = pl.pow2_x = true;
    pl.y_format = TickFormat::SI;
    std::vector<int64_t> ctxs = {0};
    for (int64_t c : {p.in.ctx / 4, p.in.ctx, 4 * p.in.ctx, 16 * p.in.ctx})
      if (c >= 1) ctxs.push_back(c);
    for (int64_t c : ctxs) {
      // A curve stops at the largest batch whose K/V still fits the memory budget.
      const int64_t fit = max_fitting_batch(p, c);
      if (fit < 1) continue;
      PlotSeries s{c == 0 ? "weights only" : "context " + format_int(c), {}, "", c == 0, false};
      if (fit < 256) s.name += " (fits B<=" + format_int(fit) + ")";
      for (int64_t b = 1; b <= std::min<int64_t>(256, fit); ++b) s.points.push_back({double(b), roofline_point(p, b, c).tok_s});
      pl.series.push_back(s);
    }
    pl.x_min = 1;
    pl.x_max = 256;
    const std::string path = (fs::path(dir) / "decode_vs_context.svg").string();
    pl.write(path);
    out.push_back(path);
  }
  return out;
}

}  // namespace kvs::tools
