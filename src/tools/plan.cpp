// Planner arithmetic (see plan.h for the decode model) and its JSON form.
// KV sizes and capacity come from kv/capacity.h, the same code the admission
// controller runs, so a plan and a live server agree block for block.
#include "tools/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

#include "tools/units.h"

namespace kvs::tools {

double Hardware::flops_for(const std::string& path) const {
  if (path == "fp32") return flops_fp32;
  if (path == "bf16") return flops_bf16;
  if (path == "int8") return flops_int8;
  throw std::invalid_argument("unknown compute path '" + path + "'");
}

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

const KernelRate* Hardware::kernel(const std::string& type) const {
  const std::string l = lower(type);
  for (const auto& k : kernels)
    if (k.type == l && !k.points.empty()) return &k;
  return nullptr;
}

std::string compute_path_for_type(const std::string& type) {
  const std::string l = lower(type);
  if (l == "f32" || l == "f16" || l == "bf16") return "fp32";  // BF16 is widened to f32 exactly
  return "int8";
}

Hardware hardware_from_profile(const HardwareProfile& p, const std::string& source) {
  Hardware h;
  h.source = source;
  h.mem_bytes = p.mem_total_bytes;
  h.bandwidth = p.bandwidth;
  h.flops_fp32 = p.fp32.peak;
  h.flops_bf16 = p.bf16.peak;
  h.flops_int8 = p.int8.peak;
  h.kernels = p.kernels;
  h.attention_ops = p.attention.ops_per_s;
  return h;
}

int64_t default_scratch_bytes(const ModelShape& m) {
  // A MoE token's FFN activations: the gate and up rows of each of its k experts.
  const int64_t ffn = std::max<int64_t>(m.ffn_dim, int64_t(m.n_expert_used) * m.expert_ffn);
  const int64_t per_token = 4 * int64_t(m.dim) + 2 * ffn + m.n_vocab;
  return 512 * per_token * 4;
}

namespace {

// Attention ops are QKᵀ and A·V, a multiply and an add each, over every
// query head, per key a query sees.

// Keys one decoded token attends over all layers at `ctx` tokens of context:
// a windowed layer reads only its window, the rest the whole context.
double attended_keys(const ModelShape& m, int64_t ctx) {
  if (m.layer_window.empty()) return double(m.n_layers) * double(ctx);
  double n = 0;
  for (int l = 0; l < m.n_layers; ++l) {
    const int w = l < int(m.layer_window.size()) ? m.layer_window[size_t(l)] : 0;
    n += double(w > 0 ? std::min<int64_t>(ctx, w) : ctx);
  }
  return n;
}

// Query-key pairs causal attention over a prompt of P tokens scores, all
// layers: a windowed layer's query sees at most its window.
double prefill_pairs(const ModelShape& m, double P) {
  double n = 0;
  for (int l = 0; l < m.n_layers; ++l) {
    const int w = l < int(m.layer_window.size()) ? m.layer_window[size_t(l)] : 0;
    n += w > 0 && w < P ? double(w) * (w + 1) / 2 + (P - w) * w : P * (P + 1) / 2;
  }
  return n;
}

// Weight bytes one decode step of `batch` sequences streams. A MoE layer
// reads only the experts some token picked: with routing taken as uniform,
// a batch touches a fraction 1 - (1 - k/E)^B of them.
double streamed_bytes(const ModelShape& m, int64_t batch) {
  const double all = double(m.streamed_weight_bytes);
  if (m.n_expert <= 0 || m.n_expert_used <= 0 || m.expert_bytes == 0) return all;
  const double touched = 1.0 - std::pow(1.0 - double(m.n_expert_used) / double(m.n_expert), double(batch));
  return all - double(m.expert_bytes) * (1.0 - touched);
}

// K/V bytes one decode step reads per sequence at `ctx`.
double decode_kv_bytes(const PlanResult& p, int64_t ctx) {
  const ModelShape& m = p.in.model;
  return attended_keys(m, ctx) * double(p.kv_bytes_per_token) / double(m.n_layers);
}

// Attention ops one decoded token does at `ctx` (QKᵀ and A·V, every query head).
double decode_attn_ops(const ModelShape& m, int64_t ctx) {
  return 4.0 * double(m.n_heads) * double(m.head_dim) * attended_keys(m, ctx);
}

Crossover crossover(uint64_t weights, int64_t batch, uint64_t kvpt, int n_ctx) {
  Crossover c;
  c.batch = batch;
  c.context = double(weights) / (double(batch) * double(kvpt));
  // Exact integer ceil: the first S with B·S·kvpt >= W.
  const unsigned __int128 w = weights, d = (unsigned __int128)uint64_t(batch) * kvpt;
  c.context_tokens = int64_t((w + d - 1) / d);
  c.within_trained_context = n_ctx > 0 && c.context_tokens <= n_ctx;
  return c;
}

}  // namespace

KernelTime kernel_seconds_per_byte(const KernelRate& k, double n) {
  const auto& v = k.points;  // ascending n, non-empty
  const auto s = [](const KernelPoint& q) { return 1.0 / q.weight_bytes_per_s; };
  if (n <= v.front().n) return {s(v.front()), "kernel n=" + std::to_string(v.front().n)};
  if (n >= v.back().n)  // past the largest n the product is compute-bound: time grows as n
    return {s(v.back()) * n / double(v.back().n), "kernel n=" + std::to_string(v.back().n) + (n > v.back().n ? " rate" : "")};
  for (size_t i = 1; i < v.size(); ++i) {
    if (n > v[i].n) continue;
    if (n == v[i].n) return {s(v[i]), "kernel n=" + std::to_string(v[i].n)};
    const double f = (n - v[i - 1].n) / double(v[i].n - v[i - 1].n);
    return {s(v[i - 1]) + f * (s(v[i]) - s(v[i - 1])),
            "kernel n=" + std::to_string(v[i - 1].n) + ".." + std::to_string(v[i].n)};
  }
  return {s(v.back()), "kernel"};  // unreachable
}

RooflinePoint roofline_point(const PlanResult& p, int64_t batch, int64_t ctx) {
  const ModelShape& m = p.in.model;
  RooflinePoint r;
  r.batch = batch;
  r.weight_bytes = streamed_bytes(m, batch);
  r.kv_bytes = double(batch) * decode_kv_bytes(p, ctx);
  r.bytes_per_step = r.weight_bytes + r.kv_bytes;
  r.ops_per_step = double(batch) * (2.0 * double(m.matmul_params) + decode_attn_ops(m, ctx));
  r.intensity = r.ops_per_step / r.bytes_per_step;
  r.t_memory = p.in.hw.bandwidth > 0 ? r.bytes_per_step / p.in.hw.bandwidth : 0;
  r.t_compute = p.peak_ops > 0 ? r.ops_per_step / p.peak_ops : 0;
  const double t = std::max(r.t_memory, r.t_compute);
  r.tok_s = t > 0 ? double(batch) / t : 0;
  r.memory_bound = r.t_memory >= r.t_compute;
  if (p.capacity_error.empty()) r.fits = batch * sequence_blocks(p, ctx) <= p.capacity.usable_blocks;
  else
    r.fits = false;

  // Expected: measured kernel rates per weight type, summed with attention.
  const Hardware& hw = p.in.hw;
  const double bw = hw.bandwidth;
  const double t_kv = bw > 0 ? r.kv_bytes / bw : 0;
  const double attn_ops = double(batch) * decode_attn_ops(m, ctx);
  // The measured attention kernel when the profile has it (it runs far
  // below the FMA peak), else the FP32 peak.
  const double attn_rate = hw.attention_ops > 0 ? hw.attention_ops : hw.flops_fp32;
  const double t_attn_ops = attn_rate > 0 ? attn_ops / attn_rate : 0;
  r.t_attention = std::max(t_kv, t_attn_ops);
  double biggest = r.t_attention;
  r.limit = t_kv >= t_attn_ops ? "KV read" : "attention compute";
  // Every weight type's part shrinks alike when a MoE batch skips experts.
  const double mix_scale = r.weight_bytes / std::max(1.0, double(m.streamed_weight_bytes));
  for (WeightPart w : p.weight_mix) {
    w.bytes *= mix_scale;
    const double t_stream = bw > 0 ? w.bytes / bw : 0;
    double t_kernel = 0;
    std::string label;
    if (const KernelRate* k = hw.kernel(w.type)) {
      const KernelTime kt = kernel_seconds_per_byte(*k, double(batch));
      t_kernel = w.bytes * kt.seconds_per_byte;
      label = kt.label;
    } else {
      const std::string path = compute_path_for_type(w.type);
      const double peak = hw.flops_for(path);
      t_kernel = peak > 0 ? 2.0 * double(batch) * w.params / peak : 0;
      label = path + " peak";
    }
    const double t = std::max(t_stream, t_kernel);
    r.t_weights += t;
    if (t > biggest) {
      biggest = t;
      r.limit = (p.weight_mix.size() > 1 ? w.type + " " : std::string()) + (t_stream >= t_kernel ? "bandwidth" : label);
    }
  }
  r.t_expected = r.t_weights + r.t_attention;
  r.tok_s_expected = r.t_expected > 0 ? double(batch) / r.t_expected : 0;
  return r;
}

int64_t sequence_blocks(const PlanResult& p, int64_t ctx) {
  if (p.hybrid.tables.empty()) return blocks_for_tokens(ctx, p.in.block_size);
  int64_t n = 0;
  for (const KvTableShape& t : p.hybrid.tables) n += table_blocks(t, ctx, p.in.block_size, p.in.max_step_tokens);
  return n;
}

// Layers of different windows: the hybrid cache's tables, and one
// sequence's bytes at 8k, 32k and the plan's context (kv/capacity.h).
static void hybrid_kv(const ModelShape& m, const PlanInput& in, PlanResult& p) {
  if (m.layer_window.empty()) return;
  std::vector<KvTableShape> tables = kv_table_shapes(m.layer_window, m.n_layers);
  if (tables.size() < 2) return;
  HybridKv& h = p.hybrid;
  h.tables = std::move(tables);
  h.layer_token_bytes = kv_bytes_per_token(1, m.n_kv_heads, m.head_dim, in.kv);
  std::vector<int64_t> ctxs = {8192, 32768};
  if (std::find(ctxs.begin(), ctxs.end(), in.ctx) == ctxs.end()) ctxs.push_back(in.ctx);
  std::sort(ctxs.begin(), ctxs.end());
  for (int64_t c : ctxs) {
    HybridKvRow r;
    r.ctx = c;
    r.full_blocks = blocks_for_tokens(c, in.block_size);
    r.full_bytes = uint64_t(r.full_blocks) * uint64_t(in.block_size) * uint64_t(m.n_layers) * h.layer_token_bytes;
    for (const KvTableShape& t : h.tables) r.hybrid_blocks += table_blocks(t, c, in.block_size, 0);
    r.hybrid_bytes = sequence_kv_bytes(h.tables, c, in.block_size, h.layer_token_bytes, 0);
    r.bound_bytes = sequence_kv_bytes(h.tables, c, in.block_size, h.layer_token_bytes, in.max_step_tokens);
    r.saving = double(r.full_bytes) / double(r.hybrid_bytes);
    h.rows.push_back(r);
  }
}

namespace {

// Checks the input and fills its defaults; notes what exceeds the model.
void plan_defaults(PlanInput& in, PlanResult& p) {
  ModelShape& m = in.model;
  if (m.n_layers < 1 || m.n_heads < 1 || m.n_kv_heads < 1 || m.head_dim < 1)
    throw std::invalid_argument("plan: model '" + m.name + "' has an incomplete shape");
  if (m.weight_bytes == 0) throw std::invalid_argument("plan: model '" + m.name + "' has no weight size");
  if (in.batch < 1) throw std::invalid_argument("plan: --batch must be >= 1, got " + std::to_string(in.batch));
  if (in.block_size < 1) throw std::invalid_argument("plan: --block-size must be >= 1");
  if (in.ctx < 0) throw std::invalid_argument("plan: --ctx must be >= 1");
  if (in.ctx == 0) in.ctx = m.n_ctx > 0 ? std::min<int64_t>(2048, m.n_ctx) : 2048;
  if (in.prompt < 0) in.prompt = std::min<int64_t>(512, in.ctx / 2);
  if (in.max_tokens < 0) in.max_tokens = std::max<int64_t>(1, std::min<int64_t>(256, in.ctx - in.prompt));
  if (in.scratch_bytes < 0) in.scratch_bytes = default_scratch_bytes(m);
  if (in.batches.empty())
    for (int64_t b = 1; b <= 256; b *= 2) in.batches.push_back(b);
  for (int64_t b : in.batches)
    if (b < 1) throw std::invalid_argument("plan: batch sizes must be >= 1");
  if (m.n_ctx > 0 && in.ctx > m.n_ctx)
    p.notes.push_back("context " + std::to_string(in.ctx) + " exceeds the model's trained context of " +
                      std::to_string(m.n_ctx));
  if (m.n_ctx > 0 && in.prompt + in.max_tokens > m.n_ctx)
    p.notes.push_back("prompt + max_tokens (" + std::to_string(in.prompt + in.max_tokens) +
                      ") exceeds the model's trained context of " + std::to_string(m.n_ctx));
}

// KV per token, and what MHA / MQA variants of the same model would cost.
void plan_kv(const PlanInput& in, PlanResult& p) {
  const ModelShape& m = in.model;
  p.kv_bytes_per_token = kv_bytes_per_token(m.n_layers, m.n_kv_heads, m.head_dim, in.kv);
  p.mha_bytes_per_token = kv_bytes_per_token(m.n_layers, m.n_heads, m.head_dim, in.kv);
  p.mqa_bytes_per_token = kv_bytes_per_token(m.n_layers, 1, m.head_dim, in.kv);
  p.gqa_saving = double(m.n_heads) / double(m.n_kv_heads);
  p.cache_bytes = uint64_t(in.batch) * uint64_t(in.ctx) * p.kv_bytes_per_token;
  const double w = double(m.weight_bytes);
  for (const KvFormat& f : standard_kv_formats()) {
    KvFormatRow r;
    r.format = f.name();
    r.bytes_per_token = kv_bytes_per_token(m.n_layers, m.n_kv_heads, m.head_dim, f);
    r.mha_bytes_per_token = kv_bytes_per_token(m.n_layers, m.n_heads, m.head_dim, f);
    r.mqa_bytes_per_token = kv_bytes_per_token(m.n_layers, 1, m.head_dim, f);
    r.cache_bytes = uint64_t(in.batch) * uint64_t(in.ctx) * r.bytes_per_token;
    r.crossover_b1 = w / double(r.bytes_per_token);
    r.crossover_b32 = w / (32.0 * double(r.bytes_per_token));
    p.formats.push_back(r);
  }
  p.crossovers.push_back(crossover(m.weight_bytes, 1, p.kv_bytes_per_token, m.n_ctx));
  p.crossovers.push_back(crossover(m.weight_bytes, 32, p.kv_bytes_per_token, m.n_ctx));
  if (in.batch != 1 && in.batch != 32)
    p.crossovers.push_back(crossover(m.weight_bytes, in.batch, p.kv_bytes_per_token, m.n_ctx));
}

// Capacity: the admission controller's estimate, worst case per request.
void plan_capacity(const PlanInput& in, PlanResult& p) {
  const ModelShape& m = in.model;
  CapacityInput& ci = p.capacity_input;
  ci.mem_budget_bytes = in.hw.mem_bytes;
  ci.weight_bytes = m.weight_bytes;
  ci.scratch_bytes = uint64_t(in.scratch_bytes);
  ci.headroom_fraction = in.headroom;
  ci.block_size = in.block_size;
  ci.kv_bytes_per_token = p.kv_bytes_per_token;
  ci.prompt_tokens = in.prompt;
  ci.max_tokens = in.max_tokens;
  hybrid_kv(m, in, p);
  if (!p.hybrid.tables.empty()) {
    ci.tables = p.hybrid.tables;
    ci.layer_token_bytes = p.hybrid.layer_token_bytes;
    ci.max_step_tokens = in.max_step_tokens;
  }
  if (in.hw.mem_bytes == 0) {
    p.capacity_error = "no memory budget: pass --mem (e.g. --mem 24GiB) or a profile";
  } else {
    try {
      p.capacity = estimate_capacity(ci);
    } catch (const std::invalid_argument& e) {
      p.capacity_error = e.what();
    }
  }
}

// The decode roofline over the plan's batch sizes.
void plan_roofline(const PlanInput& in, PlanResult& p) {
  const ModelShape& m = in.model;
  p.weight_mix = in.weight_mix;
  if (p.weight_mix.empty()) {
    // "q4_0", "q4_k (some rows q8_0/f16)", "mixed (q4_0 + f32)": the first type named.
    std::string t = m.weight_type;
    if (t.rfind("mixed (", 0) == 0) t = t.substr(7);
    t = lower(t.substr(0, t.find_first_of(" )")));
    p.weight_mix.push_back({t, double(m.streamed_weight_bytes), double(m.matmul_params)});
  }
  for (auto& w : p.weight_mix) {
    w.type = lower(w.type);
    if (in.hw.kernel(w.type)) p.has_kernel_rates = true;
  }
  p.compute_path = m.compute_path.empty() ? "fp32" : m.compute_path;
  p.peak_ops = in.hw.flops_for(p.compute_path);
  p.has_roofline = in.hw.bandwidth > 0;
  const double W = double(m.streamed_weight_bytes);
  const double kv_ctx = decode_kv_bytes(p, in.ctx);  // K/V bytes per sequence per step
  p.kv_overtakes_batch = int64_t(std::ceil(W / kv_ctx - 1e-12));
  if (p.kv_overtakes_batch < 1) p.kv_overtakes_batch = 1;
  if (p.has_roofline) {
    if (p.peak_ops > 0) {
      p.ridge_intensity = p.peak_ops / in.hw.bandwidth;
      // t_compute(B) = t_memory(B)  <=>  B·(o/P − S·k/bw) = W/bw, o = ops per sequence.
      const double o = 2.0 * double(m.matmul_params) + decode_attn_ops(m, in.ctx);
      const double denom = o / p.peak_ops - kv_ctx / in.hw.bandwidth;
      if (denom > 0) p.compute_bound_batch = std::max<int64_t>(1, int64_t(std::ceil(W / in.hw.bandwidth / denom)));
    }
    for (int64_t b : in.batches) p.roofline.push_back(roofline_point(p, b, in.ctx));
  }
}

// Prefill of one prompt: matmuls over every token plus causal attention;
// and what reloading or transferring that prompt's KV would take instead.
void plan_prefill(const PlanInput& in, PlanResult& p) {
  const ModelShape& m = in.model;
  const double W = double(m.streamed_weight_bytes);
  PrefillEstimate& pf = p.prefill;
  pf.tokens = std::max<int64_t>(1, in.prompt);
  const double P = double(pf.tokens);
  pf.ops = 2.0 * double(m.matmul_params) * P + 4.0 * double(m.n_heads) * double(m.head_dim) * prefill_pairs(m, P);
  pf.bytes = W + P * double(p.kv_bytes_per_token);
  const double tm = in.hw.bandwidth > 0 ? pf.bytes / in.hw.bandwidth : 0;
  const double tc = p.peak_ops > 0 ? pf.ops / p.peak_ops : 0;
  pf.seconds = std::max(tm, tc);
  pf.tok_s = pf.seconds > 0 ? P / pf.seconds : 0;
  pf.compute_bound = tc > tm;
  TierReadEstimate& tr = p.tier_read;
  tr.tokens = pf.tokens / in.block_size * in.block_size;
  tr.bytes = double(tr.tokens) * double(p.kv_bytes_per_token);
  tr.disk_s = in.disk_read_bps > 0 ? tr.bytes / in.disk_read_bps : 0;
  tr.redis_s = in.redis_read_bps > 0 ? tr.bytes / in.redis_read_bps : 0;
  TransferEstimate& xf = p.transfer;
  xf.tokens = pf.tokens;
  xf.formula_bytes = P * double(p.kv_bytes_per_token);
  xf.wire_bytes = double((pf.tokens + in.block_size - 1) / in.block_size * in.block_size) * double(p.kv_bytes_per_token);
  xf.seconds = in.link_bps > 0 ? xf.wire_bytes / in.link_bps : 0;
  xf.breakeven_bps = pf.seconds > 0 ? xf.wire_bytes / pf.seconds : 0;
}

}  // namespace

PlanResult make_plan(PlanInput in) {
  PlanResult p;
  plan_defaults(in, p);
  plan_kv(in, p);
  plan_capacity(in, p);
  p.in = in;
  plan_roofline(in, p);
  plan_prefill(in, p);
  if (p.has_roofline && !p.has_kernel_rates)
    p.notes.push_back("no measured kernel rate for the model's weight types (re-run `kvserve probe`): "
                      "expected decode = roofline terms summed");
  if (!p.has_roofline) p.notes.push_back("no bandwidth given (--bandwidth, --profile or --probe): no decode roofline");
  else if (p.peak_ops <= 0)
    p.notes.push_back("no compute rate for the " + p.compute_path +
                      " path (--flops, --profile or --probe): decode treated as purely memory-bound");
  return p;
}

namespace {

using nlohmann::json;

json capacity_json(const PlanResult& p) {
  const CapacityInput& ci = p.capacity_input;
  json cap = {{"mem_budget_bytes", ci.mem_budget_bytes}, {"weight_bytes", ci.weight_bytes},
              {"scratch_bytes", ci.scratch_bytes},       {"headroom_fraction", ci.headroom_fraction},
              {"block_size", ci.block_size},             {"prompt_tokens", ci.prompt_tokens},
              {"max_tokens", ci.max_tokens}};
  if (!p.capacity_error.empty()) {
    cap["error"] = p.capacity_error;
  } else {
    const CapacityResult& c = p.capacity;
    cap["bytes_per_block"] = c.bytes_per_block;
    cap["kv_budget_bytes"] = c.kv_budget_bytes;
    cap["total_blocks"] = c.total_blocks;
    cap["headroom_blocks"] = c.headroom_blocks;
    cap["usable_blocks"] = c.usable_blocks;
    cap["blocks_per_request"] = c.blocks_per_request;
    cap["max_concurrent_sequences"] = c.max_concurrent_sequences;
    cap["max_tokens_resident"] = c.max_tokens_resident;
  }
  return cap;
}

json hybrid_json(const HybridKv& hk) {
  json h;
  h["layer_token_bytes"] = hk.layer_token_bytes;
  h["tables"] = json::array();
  for (const KvTableShape& t : hk.tables) h["tables"].push_back({{"slots", t.slots}, {"window", t.window}});
  h["sequence"] = json::array();
  for (const HybridKvRow& r : hk.rows)
    h["sequence"].push_back({{"ctx", r.ctx},
                             {"full_bytes", r.full_bytes},
                             {"hybrid_bytes", r.hybrid_bytes},
                             {"bound_bytes", r.bound_bytes},
                             {"full_blocks", r.full_blocks},
                             {"hybrid_blocks", r.hybrid_blocks},
                             {"saving", r.saving}});
  return h;
}

json roofline_json(const PlanResult& p) {
  json roof = {{"context", p.in.ctx},
               {"compute_path", p.compute_path},
               {"peak_ops_per_s", p.peak_ops},
               {"bandwidth_bytes_per_s", p.in.hw.bandwidth},
               {"ridge_intensity", p.ridge_intensity},
               {"kv_overtakes_weights_batch", p.kv_overtakes_batch},
               {"compute_bound_batch", p.compute_bound_batch}};
  json pts = json::array();
  for (const auto& r : p.roofline)
    pts.push_back({{"batch", r.batch},
                   {"weight_bytes", r.weight_bytes},
                   {"kv_bytes", r.kv_bytes},
                   {"bytes_per_step", r.bytes_per_step},
                   {"ops_per_step", r.ops_per_step},
                   {"intensity", r.intensity},
                   {"t_memory_s", r.t_memory},
                   {"t_compute_s", r.t_compute},
                   {"tok_s", r.tok_s},
                   {"bound", r.memory_bound ? "memory" : "compute"},
                   {"fits", r.fits},
                   {"expected",
                    {{"t_weights_s", r.t_weights},
                     {"t_attention_s", r.t_attention},
                     {"step_s", r.t_expected},
                     {"tok_s", r.tok_s_expected},
                     {"limit", r.limit}}}});
  roof["points"] = pts;
  json mix = json::array();
  for (const auto& w : p.weight_mix) {
    json e = {{"type", w.type}, {"bytes", w.bytes}, {"params", w.params}};
    if (const KernelRate* k = p.in.hw.kernel(w.type)) {
      json kp = json::array();
      for (const auto& q : k->points)
        kp.push_back({{"n", q.n}, {"ops_per_s", q.ops_per_s}, {"weight_bytes_per_s", q.weight_bytes_per_s}});
      e["kernel"] = kp;
    }
    mix.push_back(e);
  }
  roof["weight_mix"] = mix;
  roof["kernel_rates"] = p.has_kernel_rates;
  return roof;
}

}  // namespace

nlohmann::json plan_to_json(const PlanResult& p) {
  using nlohmann::json;
  const ModelShape& m = p.in.model;
  json j;
  j["model"] = {{"name", m.name},         {"arch", m.arch},
                {"source", m.source},     {"n_layers", m.n_layers},
                {"n_heads", m.n_heads},   {"n_kv_heads", m.n_kv_heads},
                {"head_dim", m.head_dim}, {"dim", m.dim},
                {"ffn_dim", m.ffn_dim},   {"n_vocab", m.n_vocab},
                {"n_ctx", m.n_ctx},       {"weight_type", m.weight_type},
                {"weight_bytes", m.weight_bytes}, {"streamed_weight_bytes", m.streamed_weight_bytes},
                {"matmul_params", m.matmul_params}, {"total_params", m.total_params}};
  if (m.n_expert > 0)
    j["model"]["experts"] = {{"count", m.n_expert}, {"used", m.n_expert_used}, {"ffn_dim", m.expert_ffn},
                             {"bytes", m.expert_bytes}};
  j["hardware"] = {{"source", p.in.hw.source},
                   {"mem_bytes", p.in.hw.mem_bytes},
                   {"bandwidth_bytes_per_s", p.in.hw.bandwidth},
                   {"flops", {{"fp32", p.in.hw.flops_fp32}, {"bf16", p.in.hw.flops_bf16}, {"int8", p.in.hw.flops_int8}}}};
  json formats = json::array();
  for (const auto& f : p.formats)
    formats.push_back({{"format", f.format},
                       {"bytes_per_token", f.bytes_per_token},
                       {"mha_bytes_per_token", f.mha_bytes_per_token},
                       {"mqa_bytes_per_token", f.mqa_bytes_per_token},
                       {"cache_bytes", f.cache_bytes},
                       {"crossover_context_b1", f.crossover_b1},
                       {"crossover_context_b32", f.crossover_b32}});
  j["kv"] = {{"format", p.in.kv.name()},
             {"bytes_per_token", p.kv_bytes_per_token},
             {"mha_bytes_per_token", p.mha_bytes_per_token},
             {"mqa_bytes_per_token", p.mqa_bytes_per_token},
             {"gqa_saving", p.gqa_saving},
             {"batch", p.in.batch},
             {"context", p.in.ctx},
             {"cache_bytes", p.cache_bytes},
             {"formats", formats}};
  json xs = json::array();
  for (const auto& c : p.crossovers)
    xs.push_back({{"batch", c.batch},
                  {"context", c.context},
                  {"context_tokens", c.context_tokens},
                  {"within_trained_context", c.within_trained_context}});
  j["crossover"] = xs;
  j["capacity"] = capacity_json(p);
  if (!p.hybrid.tables.empty()) j["hybrid_kv"] = hybrid_json(p.hybrid);
  j["roofline"] = roofline_json(p);
  j["prefill"] = {{"tokens", p.prefill.tokens},        {"ops", p.prefill.ops},
                  {"bytes", p.prefill.bytes},          {"seconds", p.prefill.seconds},
                  {"tok_s", p.prefill.tok_s},          {"bound", p.prefill.compute_bound ? "compute" : "memory"}};
  j["tier_read"] = {{"tokens", p.tier_read.tokens},
                    {"bytes", p.tier_read.bytes},
                    {"disk_seconds", p.tier_read.disk_s},
                    {"redis_seconds", p.tier_read.redis_s},
                    {"disk_read_bytes_per_s", p.in.disk_read_bps},
                    {"redis_read_bytes_per_s", p.in.redis_read_bps}};
  j["transfer"] = {{"tokens", p.transfer.tokens},
                   {"formula_bytes", p.transfer.formula_bytes},
                   {"wire_bytes", p.transfer.wire_bytes},
                   {"seconds", p.transfer.seconds},
                   {"link_bytes_per_s", p.in.link_bps},
                   {"breakeven_bytes_per_s", p.transfer.breakeven_bps}};
  j["notes"] = p.notes;
  return j;
}

}  // namespace kvs::tools
