// kvserve plan: presets, capacity and roofline against figures computed by
// hand from public model cards, expected decode from measured kernel rates,
// JSON keys, SVG well-formedness and the command line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

#include "kv/capacity.h"
#include "test_util.h"
#include "tools/make_model.h"
#include "tools/plan.h"
#include "tools/plot_svg.h"
#include "tools/presets.h"
#include "tools/probe.h"

using namespace kvs;
using namespace kvs::tools;

namespace {

PlanInput preset_input(const std::string& name, const std::string& quant = "f16") {
  PlanInput in;
  in.model = priced_shape(find_preset(name), parse_weight_quant(quant));
  in.hw.source = "test";
  in.hw.mem_bytes = 24ull << 30;
  in.hw.bandwidth = 80e9;
  in.hw.flops_fp32 = in.hw.flops_bf16 = in.hw.flops_int8 = 1e12;
  return in;
}

// Every opening tag has its closing tag in order (self-closing ones excepted).
bool balanced_xml(const std::string& s, std::string* why) {
  std::vector<std::string> stack;
  size_t i = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    const size_t j = s.find('>', i);
    if (j == std::string::npos) return *why = "unterminated tag", false;
    const std::string tag = s.substr(i + 1, j - i - 1);
    i = j + 1;
    if (tag.empty()) return *why = "empty tag", false;
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (tag.back() == '/') continue;
    const std::string name = tag.substr(tag[0] == '/' ? 1 : 0, tag.find_first_of(" \n\t") - (tag[0] == '/' ? 1 : 0));
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != name) return *why = "unbalanced </" + name + ">", false;
      stack.pop_back();
    } else {
      stack.push_back(name);
    }
  }
  if (!stack.empty()) return *why = "unclosed <" + stack.back() + ">", false;
  return true;
}

}  // namespace

// ---- presets -------------------------------------------------------------------

TEST(Presets, ShapesMatchPublishedParameterCounts) {
  for (const ModelShape& s : presets()) {
    if (s.published_params == 0) continue;
    EXPECT_EQ(shape_param_count(s), s.published_params) << s.name;
  }
  EXPECT_EQ(find_preset("llama-2-70b").ffn_dim, 28672);
  EXPECT_EQ(find_preset("Qwen2.5-7B").n_kv_heads, 4);
  EXPECT_THROW(find_preset("llama-9"), std::invalid_argument);
}

TEST(Presets, WeightBytes) {
  // Llama-2-7B at f16: 6,738,149,376 matrix params × 2 B + 266,240 norm params × 4 B.
  const ModelShape l7 = priced_shape(find_preset("llama-2-7b"), WeightQuant::F16);
  EXPECT_EQ(l7.weight_bytes, 13477363712u);
  EXPECT_EQ(l7.streamed_weight_bytes, 13477363712u - 32000ull * 4096 * 2);  // token_embd is gathered
  EXPECT_EQ(l7.total_params, 6738415616);
  // The 1.1B bench model: Q8_0 = 34 B / 32 weights, Q4_0 = 18 B / 32.
  const ModelShape b = find_preset("kvs-bench-1.1b");
  const int64_t mats = 16 * (2048LL * 2048 * 2 + 2048LL * 512 * 2 + 3LL * 2048 * 8192) + 2 * 32000LL * 2048;
  const int64_t vecs = 16 * 2 * 2048 + 2048;
  EXPECT_EQ(shape_param_count(b), mats + vecs);
  EXPECT_EQ(priced_shape(b, WeightQuant::F16).weight_bytes, uint64_t(mats * 2 + vecs * 4));
  EXPECT_EQ(priced_shape(b, WeightQuant::Q8_0).weight_bytes, uint64_t(mats / 32 * 34 + vecs * 4));
  EXPECT_EQ(priced_shape(b, WeightQuant::Q4_0).weight_bytes, uint64_t(mats / 32 * 18 + vecs * 4));
  // Qwen2.5-0.5B (dim 896) does not divide into 256-element K-quant blocks:
  // those rows fall back to Q8_0, as llama.cpp does.
  EXPECT_NE(priced_shape(find_preset("qwen2.5-0.5b"), WeightQuant::Q4_K).weight_type.find("q8_0"), std::string::npos);
  EXPECT_EQ(priced_shape(find_preset("llama-2-7b"), WeightQuant::Q4_K).weight_type, "q4_k");
  EXPECT_THROW(parse_weight_quant("q3_k"), std::invalid_argument);
}

// The MoE presets: Mixtral's count is exact (above); the others against the
// rounded totals and active counts of their model cards; gpt-oss's experts
// priced in MXFP4 whatever the rest is stored as, and its even layers a
// window of their own in the hybrid cache.
TEST(Presets, MixtureOfExperts) {
  const auto billions = [](int64_t n) { return std::round(double(n) / 1e7) / 100; };  // two decimals
  EXPECT_EQ(billions(shape_param_count(find_preset("qwen3-30b-a3b"))), 30.53);  // card: 30.5B
  const ModelShape g20 = priced_shape(find_preset("gpt-oss-20b"), WeightQuant::Q8_0);
  const ModelShape g120 = priced_shape(find_preset("gpt-oss-120b"), WeightQuant::Q8_0);
  EXPECT_EQ(billions(g20.total_params), 20.91);
  EXPECT_EQ(billions(g120.total_params), 116.83);
  EXPECT_EQ(billions(g20.matmul_params), 3.61);  // active per token, the card's figure
  EXPECT_EQ(billions(g120.matmul_params), 5.13);
  EXPECT_EQ(g20.expert_bytes, 24ull * 32 * 3 * 2880 * (2880 / 32) * 17);
  EXPECT_EQ(g20.weight_type, "q8_0 (experts mxfp4)");
  const ModelShape mx = priced_shape(find_preset("mixtral-8x7b"), WeightQuant::Q4_0);
  EXPECT_EQ(mx.expert_bytes, 32ull * 8 * 3 * 4096 * (14336 / 32) * 18);
  EXPECT_EQ(mx.matmul_params, 32LL * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * 4096 + 2LL * 3 * 4096 * 14336) +
                                  32000LL * 4096);
  PlanInput in;
  in.model = g20;
  in.hw.bandwidth = 50e9;
  in.hw.mem_bytes = 64ull << 30;
  in.batches = {1};
  const PlanResult p = make_plan(in);
  EXPECT_DOUBLE_EQ(p.roofline.at(0).weight_bytes,
                   double(g20.streamed_weight_bytes) - double(g20.expert_bytes) * (1.0 - 4.0 / 32));
  ASSERT_EQ(p.hybrid.tables.size(), 2u);
  EXPECT_EQ(p.hybrid.tables[1].window, 128);
}

// ---- the planner ---------------------------------------------------------------

TEST(Plan, CrossoverContexts) {
  struct Case {
    const char* preset;
    uint64_t kvpt;
    int64_t b1, b32;
  };
  // W / (B × kvpt), rounded up to the first context where cache >= weights;
  // W is the f16 file size (matrices f16, norms and biases f32).
  const Case cases[] = {
      {"llama-2-7b", 524288, 25707, 804},     // 13,477,363,712 / 524,288 = 25,706.03
      {"llama-2-70b", 327680, 421009, 13157}, // 137,955,934,208 / 327,680 = 421,008.1
      {"llama-3-8b", 131072, 122537, 3830},   // 16,061,054,976 / 131,072 = 122,536.1
      {"qwen2.5-7b", 57344, 265624, 8301},    // 15,231,899,648 / 57,344 = 265,623.25
      {"qwen2.5-0.5b", 12288, 80421, 2514},   // 988,208,640 / 12,288 = 80,420.6
  };
  for (const Case& c : cases) {
    PlanInput in = preset_input(c.preset);
    in.hw.mem_bytes = 1ull << 40;
    const PlanResult p = make_plan(in);
    EXPECT_EQ(p.kv_bytes_per_token, c.kvpt) << c.preset;
    ASSERT_GE(p.crossovers.size(), 2u);
    EXPECT_EQ(p.crossovers[0].batch, 1);
    EXPECT_EQ(p.crossovers[0].context_tokens, c.b1) << c.preset;
    EXPECT_EQ(p.crossovers[1].batch, 32);
    EXPECT_EQ(p.crossovers[1].context_tokens, c.b32) << c.preset;
  }
}

TEST(Plan, MhaMqaAndGqaSaving) {
  const PlanResult p = make_plan(preset_input("llama-2-70b"));
  EXPECT_EQ(p.kv_bytes_per_token, 327680u);
  EXPECT_EQ(p.mha_bytes_per_token, 2621440u);  // 64 KV heads
  EXPECT_EQ(p.mqa_bytes_per_token, 40960u);    // 1 KV head
  EXPECT_DOUBLE_EQ(p.gqa_saving, 8.0);
  EXPECT_EQ(p.formats.size(), 5u);
}

TEST(Plan, MaxSequencesLlama3On24GiB) {
  // 24 GiB − 16,061,054,976 B weights − 512 MiB scratch = 9,171,877,888 B;
  // / 2 MiB blocks = 4,373; 5% headroom = 219; usable 4,154; 512 + 256
  // tokens = 48 blocks per request -> 86 sequences.
  PlanInput in = preset_input("llama-3-8b");
  in.scratch_bytes = 512ll << 20;
  in.prompt = 512;
  in.max_tokens = 256;
  const PlanResult p = make_plan(in);
  ASSERT_TRUE(p.capacity_error.empty()) << p.capacity_error;
  EXPECT_EQ(p.capacity.kv_budget_bytes, 9171877888u);
  EXPECT_EQ(p.capacity.total_blocks, 4373);
  EXPECT_EQ(p.capacity.usable_blocks, 4154);
  EXPECT_EQ(p.capacity.blocks_per_request, 48);
  EXPECT_EQ(p.capacity.max_concurrent_sequences, 86);
}

TEST(Plan, MaxSequencesMoreModels) {
  struct Case {
    const char* preset;
    uint64_t mem, scratch;
    int block;
    double headroom;
    int64_t prompt, max_tokens;
    uint64_t kv_budget;
    int64_t total, usable, per_request, max_seqs;
  };
  const Case cases[] = {
      // Llama-2-7B: 24 GiB − 13,477,363,712 − 512 MiB = 11,755,569,152 B; / 8 MiB
      // blocks = 1,401; −71 (5%) = 1,330; 2,048 tokens = 128 blocks -> 10.
      {"llama-2-7b", 24ull << 30, 512ull << 20, 16, 0.05, 1024, 1024, 11755569152u, 1401, 1330, 128, 10},
      // Qwen2.5-7B: 40 GiB − 15,231,899,648 − 1 GiB = 26,644,031,488 B; / 917,504 B
      // blocks = 29,039; −1,452 = 27,587; 3,000 tokens = 188 blocks -> 146.
      {"qwen2.5-7b", 40ull << 30, 1ull << 30, 16, 0.05, 2000, 1000, 26644031488u, 29039, 27587, 188, 146},
      // Llama-2-70B: 192 GiB − 137,955,934,208 − 1 GiB = 67,128,754,176 B; / 10 MiB
      // blocks of 32 = 6,401; −641 (10%) = 5,760; 4,000 tokens = 125 blocks -> 46.
      {"llama-2-70b", 192ull << 30, 1ull << 30, 32, 0.10, 3000, 1000, 67128754176u, 6401, 5760, 125, 46},
  };
  for (const Case& c : cases) {
    PlanInput in = preset_input(c.preset);
    in.hw.mem_bytes = c.mem;
    in.scratch_bytes = int64_t(c.scratch);
    in.block_size = c.block;
    in.headroom = c.headroom;
    in.prompt = c.prompt;
    in.max_tokens = c.max_tokens;
    const PlanResult p = make_plan(in);
    ASSERT_TRUE(p.capacity_error.empty()) << c.preset << ": " << p.capacity_error;
    EXPECT_EQ(p.capacity.kv_budget_bytes, c.kv_budget) << c.preset;
    EXPECT_EQ(p.capacity.total_blocks, c.total) << c.preset;
    EXPECT_EQ(p.capacity.usable_blocks, c.usable) << c.preset;
    EXPECT_EQ(p.capacity.blocks_per_request, c.per_request) << c.preset;
    EXPECT_EQ(p.capacity.max_concurrent_sequences, c.max_seqs) << c.preset;
  }
}

TEST(Plan, CapacityErrorKeepsTheRestOfThePlan) {
  PlanInput in = preset_input("llama-2-70b");  // 128 GiB of weights into 24 GiB
  const PlanResult p = make_plan(in);
  EXPECT_NE(p.capacity_error.find("cannot hold the weights"), std::string::npos);
  EXPECT_EQ(p.kv_bytes_per_token, 327680u);
  EXPECT_FALSE(p.roofline.empty());
  EXPECT_NE(format_plan(p).find("error:"), std::string::npos);
  EXPECT_TRUE(plan_to_json(p)["capacity"].contains("error"));
}

TEST(Plan, RooflineArithmetic) {
  PlanInput in = preset_input("llama-3-8b");
  in.ctx = 2048;
  const PlanResult p = make_plan(in);
  ASSERT_TRUE(p.has_roofline);
  const ModelShape& m = p.in.model;
  const RooflinePoint& r1 = p.roofline.at(0);
  ASSERT_EQ(r1.batch, 1);
  EXPECT_DOUBLE_EQ(r1.bytes_per_step, double(m.streamed_weight_bytes) + 2048.0 * 131072);
  EXPECT_NEAR(r1.tok_s, 80e9 / r1.bytes_per_step, 1e-9);  // memory-bound at batch 1
  EXPECT_TRUE(r1.memory_bound);
  // KV reads overtake the weight reads at ceil(W / (S × kvpt)).
  EXPECT_EQ(p.kv_overtakes_batch, int64_t(std::ceil(double(m.streamed_weight_bytes) / (2048.0 * 131072))));
  // Tokens/s grow with batch, but less than linearly once KV dominates.
  for (size_t i = 1; i < p.roofline.size(); ++i) {
    EXPECT_GE(p.roofline[i].tok_s, p.roofline[i - 1].tok_s);  // flat once compute-bound
    EXPECT_LT(p.roofline[i].tok_s, 2.0 * p.roofline[i - 1].tok_s);
  }
  // At 1 TOP/s / 80 GB/s the ridge is 12.5 ops/B; large batches turn compute-bound.
  EXPECT_DOUBLE_EQ(p.ridge_intensity, 12.5);
  ASSERT_GT(p.compute_bound_batch, 0);
  const RooflinePoint below = roofline_point(p, p.compute_bound_batch - 1, 2048);
  const RooflinePoint at = roofline_point(p, p.compute_bound_batch, 2048);
  EXPECT_TRUE(below.memory_bound || p.compute_bound_batch == 1);
  EXPECT_FALSE(at.memory_bound);
  EXPECT_GT(p.prefill.tok_s, r1.tok_s);
}

TEST(Plan, TierReloadOfThePromptsFullBlocks) {
  PlanInput in = preset_input("llama-3-8b");  // f16 KV: 131072 bytes per token
  in.ctx = 4096;
  in.prompt = 2010;
  in.block_size = 16;
  in.disk_read_bps = 2e9;
  in.redis_read_bps = 1e9;
  const PlanResult p = make_plan(in);
  EXPECT_EQ(p.tier_read.tokens, 2000);  // 125 full blocks; the tail is recomputed anyway
  EXPECT_DOUBLE_EQ(p.tier_read.bytes, 2000.0 * 131072);
  EXPECT_DOUBLE_EQ(p.tier_read.disk_s, 2000.0 * 131072 / 2e9);
  EXPECT_DOUBLE_EQ(p.tier_read.redis_s, 2000.0 * 131072 / 1e9);
  EXPECT_GT(p.prefill.seconds, 10 * p.tier_read.redis_s);
  EXPECT_NE(format_plan(p).find("reloading its 2000 tokens"), std::string::npos);
  EXPECT_EQ(plan_to_json(p)["tier_read"]["tokens"], 2000);
}

TEST(Plan, DisaggTransferOfThePromptsBlocks) {
  PlanInput in = preset_input("llama-3-8b");  // f16 KV: 131072 bytes per token
  in.ctx = 4096;
  in.prompt = 2010;
  in.block_size = 16;
  in.link_bps = 25e9;
  const PlanResult p = make_plan(in);
  EXPECT_EQ(p.transfer.tokens, 2010);
  EXPECT_DOUBLE_EQ(p.transfer.formula_bytes, 2010.0 * 131072);
  EXPECT_DOUBLE_EQ(p.transfer.wire_bytes, 2016.0 * 131072);  // 126 blocks: the tail block travels whole
  EXPECT_DOUBLE_EQ(p.transfer.seconds, 2016.0 * 131072 / 25e9);
  EXPECT_DOUBLE_EQ(p.transfer.breakeven_bps, 2016.0 * 131072 / p.prefill.seconds);
  EXPECT_NE(format_plan(p).find("shipping beats recomputing above"), std::string::npos);
  EXPECT_EQ(plan_to_json(p)["transfer"]["wire_bytes"], 2016.0 * 131072);
}

TEST(Plan, BadInputs) {
  PlanInput in = preset_input("llama-3-8b");
  in.batch = 0;
  EXPECT_THROW(make_plan(in), std::invalid_argument);
  in = preset_input("llama-3-8b");
  in.block_size = 0;
  EXPECT_THROW(make_plan(in), std::invalid_argument);
}

TEST(Plan, JsonKeys) {
  const nlohmann::json j = plan_to_json(make_plan(preset_input("mistral-7b")));
  for (const char* k : {"model", "hardware", "kv", "crossover", "capacity", "roofline", "prefill", "notes"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["kv"]["bytes_per_token"], 131072);
  EXPECT_EQ(j["kv"]["formats"].size(), 5u);
  EXPECT_TRUE(j["capacity"].contains("max_concurrent_sequences"));
  EXPECT_TRUE(j["roofline"].contains("kv_overtakes_weights_batch"));
  EXPECT_EQ(j["roofline"]["points"].size(), 9u);  // 1, 2, 4 ... 256
  EXPECT_TRUE(j["roofline"]["points"][0].contains("tok_s"));
  EXPECT_EQ(j["model"]["n_kv_heads"], 8);
}

// ---- GGUF metadata -------------------------------------------------------------

TEST(PlanGguf, Stories260K) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  const ModelShape s = shape_from_gguf(test::shared("models/stories260K/stories260K.gguf"));
  EXPECT_EQ(s.n_layers, 5);
  EXPECT_EQ(s.n_heads, 8);
  EXPECT_EQ(s.n_kv_heads, 4);
  EXPECT_EQ(s.head_dim, 8);
  EXPECT_EQ(s.n_ctx, 512);
  // 2 × 5 × 4 × 8 × 2 B = 640 B per token at f16.
  EXPECT_EQ(kv_bytes_per_token(s.n_layers, s.n_kv_heads, s.head_dim, KvFormat::f16()), 640u);
  EXPECT_GT(s.weight_bytes, 900000u);
  EXPECT_LT(s.weight_bytes, 1185376u);  // less than the file
  // The GGUF conversion stores output.weight separately, so the 512 × 64 f32
  // token_embd is only gathered, never streamed.
  EXPECT_EQ(s.weight_bytes - s.streamed_weight_bytes, 512u * 64 * 4);
}

TEST(PlanGguf, TensorSizesMatchPricing) {
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  // tiny-llama-f16: dim 256, ffn 704, 4 layers, 8 heads, 2 KV heads, head_dim 32,
  // tied, 32000 vocab, F16 matrices and F32 norms: priced_shape must give the
  // file's exact tensor bytes.
  const ModelShape g = shape_from_gguf(test::shared("models/tiny-random/tiny-llama-f16.gguf"));
  ModelShape s = g;
  const ModelShape priced = priced_shape(s, WeightQuant::F16);
  EXPECT_EQ(g.weight_bytes, priced.weight_bytes);
  EXPECT_EQ(g.weight_bytes, 22029312u);
  EXPECT_EQ(g.matmul_params, priced.matmul_params);
  EXPECT_EQ(g.compute_path, "fp32");
  const ModelShape q = shape_from_gguf(test::shared("models/tiny-random/tiny-llama-q4_0.gguf"));
  EXPECT_EQ(q.compute_path, "int8");
  EXPECT_NE(q.weight_type.find("mixed"), std::string::npos);  // Q4_0 + Q6_K embeddings
}

// A MoE file: a token multiplies its k experts, not all of them; every
// expert stays resident and streamed.
TEST(PlanGguf, MixtureOfExpertsCountsTheExpertsATokenRuns) {
  MakeModelOptions o;
  o.out = test::temp_dir() + "/plan-moe.gguf";
  o.type = GgmlType::F16;
  o.n_expert = 8;
  o.n_expert_used = 2;
  o.progress = false;
  make_random_model(o);
  const ModelShape g = shape_from_gguf(o.out);
  o.out = test::temp_dir() + "/plan-dense.gguf";
  o.n_expert = o.n_expert_used = 0;
  make_random_model(o);
  const ModelShape d = shape_from_gguf(o.out);
  const int64_t router = int64_t(8) * o.dim;
  EXPECT_EQ(g.matmul_params, d.matmul_params + o.n_layers * (router + int64_t(3) * o.dim * o.ffn_dim));  // 2 experts
  EXPECT_GT(g.streamed_weight_bytes, d.streamed_weight_bytes + uint64_t(o.n_layers) * 6 * 3 * 2 * o.dim * o.ffn_dim);
  // The experts' bytes (F16: 8 experts x 3 matrices), and what a decode step
  // streams: one sequence reads 2 of 8 experts; B sequences, uniformly
  // routed, a fraction 1 - (6/8)^B of them.
  const uint64_t experts = uint64_t(o.n_layers) * 8 * 3 * 2 * o.dim * o.ffn_dim;
  EXPECT_EQ(g.expert_bytes, experts);
  EXPECT_EQ(g.n_expert, 8);
  EXPECT_EQ(g.n_expert_used, 2);
  EXPECT_EQ(g.expert_ffn, o.ffn_dim);  // a Mixtral-style file's experts are --ffn wide
  PlanInput in;
  in.model = g;
  in.hw.bandwidth = 10e9;
  in.batches = {1, 4};
  const PlanResult p = make_plan(in);
  const double all = double(g.streamed_weight_bytes);
  EXPECT_DOUBLE_EQ(p.roofline.at(0).weight_bytes, all - double(experts) * 0.75);
  EXPECT_DOUBLE_EQ(p.roofline.at(1).weight_bytes, all - double(experts) * std::pow(0.75, 4));
  in.model = d;
  EXPECT_DOUBLE_EQ(make_plan(in).roofline.at(0).weight_bytes, double(d.streamed_weight_bytes));
}

// ---- SVG -------------------------------------------------------------------------

TEST(PlotSvg, WellFormed) {
  Plot pl;
  pl.title = "a <title> & more";
  pl.log_x = pl.log_y = pl.pow2_x = true;
  pl.y_format = TickFormat::Bytes;
  PlotSeries s{"one", {}, "", false, true};
  for (int i = 1; i <= 64; i *= 2) s.points.push_back({double(i), 1000.0 * i});
  pl.series.push_back(s);
  pl.series.push_back({"two", {{1, 5000}, {64, 5000}}, "#000", true, false});
  pl.regions.push_back({1, 8, "#2ca02c", "memory-bound"});
  pl.lines.push_back({16, true, "mark", "#f00"});
  const std::string svg = pl.render();
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  std::string why;
  EXPECT_TRUE(balanced_xml(svg, &why)) << why;
  EXPECT_NE(svg.find("a &lt;title&gt; &amp; more"), std::string::npos);
  EXPECT_NE(svg.find("memory-bound"), std::string::npos);
  EXPECT_NE(svg.find(">one<"), std::string::npos);
  Plot bad = pl;
  bad.series[0].points.push_back({0, 1});  // zero on a log axis
  EXPECT_THROW(bad.render(), std::invalid_argument);
  Plot empty;
  EXPECT_THROW(empty.render(), std::invalid_argument);
}

TEST(PlotSvg, PlanPlotsAreWritten) {
  const std::string dir = test::temp_dir() + "/plots";
  PlanInput in = preset_input("llama-3-8b");
  const auto files = write_plan_plots(make_plan(in), dir);
  ASSERT_EQ(files.size(), 3u);
  for (const auto& f : files) {
    const std::string svg = test::read_file(f);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u) << f;
    std::string why;
    EXPECT_TRUE(balanced_xml(svg, &why)) << f << ": " << why;
  }
}

// ---- expected decode from measured kernel rates ----------------------------------

namespace {
KernelRate synthetic_q8_kernel() {
  // Seconds per weight byte: 1e-10 at n=1, 2e-10 at n=16, 1e-9 at n=128.
  KernelRate k;
  k.type = "q8_0";
  k.points = {{1, 2e9, 10e9}, {16, 16e9, 5e9}, {128, 64e9, 1e9}};
  return k;
}
PlanInput synthetic_input() {
  PlanInput in = preset_input("llama-3-8b");
  in.hw.bandwidth = 20e9;
  in.hw.flops_fp32 = 1e12;
  in.hw.flops_int8 = 4e12;
  in.ctx = 100;
  in.batches = {1, 8, 16, 256};
  in.weight_mix = {{"Q8_0", 1e9, 1e9}};
  return in;
}
double attention_time(const PlanResult& p, int64_t b) {
  const ModelShape& m = p.in.model;
  const double kv = double(b) * 100.0 * double(p.kv_bytes_per_token) / 20e9;
  const double ops = double(b) * 4.0 * m.n_layers * m.n_heads * m.head_dim * 100.0 / 1e12;
  return std::max(kv, ops);
}
}  // namespace

TEST(PlanExpected, KernelRatesExactArithmetic) {
  PlanInput in = synthetic_input();
  in.hw.kernels = {synthetic_q8_kernel()};
  const PlanResult p = make_plan(in);
  ASSERT_TRUE(p.has_kernel_rates);
  ASSERT_EQ(p.weight_mix.size(), 1u);
  EXPECT_EQ(p.weight_mix[0].type, "q8_0");  // lower-cased
  ASSERT_EQ(p.roofline.size(), 4u);
  // B=1: the n=1 kernel (10 GB/s) is slower than the 20 GB/s bandwidth.
  const double tw[] = {0.1, 1e9 * (1e-10 + 7.0 / 15.0 * 1e-10), 0.2, 2.0};
  const char* limit[] = {"kernel n=1", "kernel n=1..16", "kernel n=16", "kernel n=128 rate"};
  for (size_t i = 0; i < 4; ++i) {
    const RooflinePoint& r = p.roofline[i];
    EXPECT_NEAR(r.t_weights, tw[i], 1e-12) << r.batch;
    EXPECT_NEAR(r.t_attention, attention_time(p, r.batch), 1e-15) << r.batch;
    EXPECT_NEAR(r.t_expected, tw[i] + attention_time(p, r.batch), 1e-12) << r.batch;
    EXPECT_NEAR(r.tok_s_expected, double(r.batch) / r.t_expected, 1e-9) << r.batch;
    EXPECT_EQ(r.limit, limit[i]) << r.batch;
  }
  // The ceiling columns are untouched by the kernel rates.
  PlanInput bare = synthetic_input();
  const PlanResult q = make_plan(bare);
  for (size_t i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(p.roofline[i].tok_s, q.roofline[i].tok_s);
  // The bandwidth binds when it is below the kernel's n=1 rate.
  in.hw.bandwidth = 5e9;
  const PlanResult slow = make_plan(in);
  EXPECT_NEAR(slow.roofline[0].t_weights, 0.2, 1e-12);
  EXPECT_EQ(slow.roofline[0].limit, "bandwidth");
}

TEST(PlanExpected, MixedTypesAndFallback) {
  PlanInput in = synthetic_input();
  in.hw.kernels = {synthetic_q8_kernel()};
  // q6_k has no measured kernel: max(bytes / bandwidth, 2·B·params / int8 peak).
  in.weight_mix = {{"q8_0", 1e9, 1e9}, {"q6_k", 4e8, 5e8}};
  const PlanResult p = make_plan(in);
  const RooflinePoint& r = p.roofline.at(2);  // batch 16
  const double q6 = std::max(4e8 / 20e9, 2.0 * 16 * 5e8 / 4e12);
  EXPECT_NEAR(r.t_weights, 0.2 + q6, 1e-12);
  EXPECT_EQ(r.limit, "q8_0 kernel n=16");
}

TEST(PlanExpected, OldProfileFallsBackToTheRoofline) {
  HardwareProfile hp;
  hp.mem_total_bytes = 24ull << 30;
  hp.bandwidth = 20e9;
  hp.fp32 = {"avx2", {}, 1e12};
  hp.bf16 = {"avx2", {}, 1e12};
  hp.int8 = {"avx2", {}, 4e12};
  nlohmann::json j = profile_to_json(hp);
  EXPECT_FALSE(j.contains("matmul"));  // what an old profile looks like
  const HardwareProfile back = profile_from_json(j);
  EXPECT_TRUE(back.kernels.empty());
  PlanInput in = synthetic_input();
  in.hw = hardware_from_profile(back, "old");
  const PlanResult p = make_plan(in);
  EXPECT_FALSE(p.has_kernel_rates);
  for (const RooflinePoint& r : p.roofline) {
    const double tw = std::max(1e9 / 20e9, 2.0 * double(r.batch) * 1e9 / 4e12);
    EXPECT_NEAR(r.t_weights, tw, 1e-12);
    EXPECT_NEAR(r.t_expected, tw + attention_time(p, r.batch), 1e-12);
  }
  bool noted = false;
  for (const auto& n : p.notes) noted |= n.find("kernel rate") != std::string::npos;
  EXPECT_TRUE(noted);
  // Without a weight mix the model's weight type names the kernel.
  PlanInput preset = preset_input("llama-3-8b", "q8_0");
  preset.hw.kernels = {synthetic_q8_kernel()};
  EXPECT_TRUE(make_plan(preset).has_kernel_rates);
}

TEST(PlanExpected, JsonKeysAndProfileRoundTrip) {
  HardwareProfile hp;
  hp.mem_total_bytes = 1ull << 30;
  hp.bandwidth = 20e9;
  hp.kernel_threads = 2;
  hp.kernel_rows = 8192;
  hp.kernel_cols = 2048;
  hp.kernel_buffer_bytes = 1ull << 30;
  hp.kernels = {synthetic_q8_kernel()};
  const nlohmann::json j = profile_to_json(hp);
  ASSERT_TRUE(j.contains("matmul"));
  for (const char* k : {"threads", "rows", "cols", "buffer_bytes", "types"}) EXPECT_TRUE(j["matmul"].contains(k)) << k;
  const auto& pts = j["matmul"]["types"]["q8_0"];
  ASSERT_EQ(pts.size(), 3u);
  EXPECT_EQ(pts[1]["n"], 16);
  EXPECT_DOUBLE_EQ(pts[1]["ops_per_s"].get<double>(), 16e9);
  EXPECT_DOUBLE_EQ(pts[0]["weight_bytes_per_s"].get<double>(), 10e9);
  const HardwareProfile back = profile_from_json(j);
  EXPECT_EQ(back.kernel_threads, 2);
  EXPECT_EQ(back.kernel_rows, 8192);
  ASSERT_NE(back.kernel("Q8_0"), nullptr);
  EXPECT_DOUBLE_EQ(back.kernel("q8_0")->at(128)->weight_bytes_per_s, 1e9);
  EXPECT_EQ(back.kernel("f16"), nullptr);
  nlohmann::json bad = j;
  bad["matmul"]["types"]["q8_0"][0]["ops_per_s"] = -1;
  EXPECT_THROW(profile_from_json(bad), std::invalid_argument);

  PlanInput in = synthetic_input();
  in.hw.kernels = hp.kernels;
  const nlohmann::json pj = plan_to_json(make_plan(in));
  const auto& e = pj["roofline"]["points"][0]["expected"];
  for (const char* k : {"t_weights_s", "t_attention_s", "step_s", "tok_s", "limit"}) EXPECT_TRUE(e.contains(k)) << k;
  EXPECT_EQ(e["limit"], "kernel n=1");
  EXPECT_TRUE(pj["roofline"]["kernel_rates"].get<bool>());
  EXPECT_EQ(pj["roofline"]["weight_mix"][0]["type"], "q8_0");
  EXPECT_EQ(pj["roofline"]["weight_mix"][0]["kernel"].size(), 3u);
  const std::string text = format_plan(make_plan(in));
  EXPECT_NE(text.find("exp. tok/s"), std::string::npos);
  EXPECT_NE(text.find("kernel n=1"), std::string::npos);
}

// The measured attention rate prices the expected attention term (the
// ceiling keeps the FP32 peak), and it round-trips through the profile.
TEST(PlanExpected, MeasuredAttentionRate) {
  PlanInput in = synthetic_input();
  in.hw.kernels = {synthetic_q8_kernel()};
  in.hw.attention_ops = 5e10;  // 20x below the 1e12 FP32 peak
  const PlanResult p = make_plan(in);
  const PlanResult q = make_plan(synthetic_input());
  const ModelShape& m = p.in.model;
  for (size_t i = 0; i < p.roofline.size(); ++i) {
    const RooflinePoint& r = p.roofline[i];
    const double kv = double(r.batch) * 100.0 * double(p.kv_bytes_per_token) / 20e9;
    const double ops = double(r.batch) * 4.0 * m.n_layers * m.n_heads * m.head_dim * 100.0 / 5e10;
    EXPECT_NEAR(r.t_attention, std::max(kv, ops), 1e-15) << r.batch;
    EXPECT_DOUBLE_EQ(r.tok_s, q.roofline[i].tok_s) << r.batch;  // the ceiling is unchanged
  }
  HardwareProfile hp;
  hp.mem_total_bytes = 1ull << 30;
  hp.bandwidth = 20e9;
  hp.attention = {512, 2, 4.5e10};
  const nlohmann::json j = profile_to_json(hp);
  ASSERT_TRUE(j.contains("attention"));
  const HardwareProfile back = profile_from_json(j);
  EXPECT_EQ(back.attention.ctx, 512);
  EXPECT_EQ(back.attention.threads, 2);
  EXPECT_DOUBLE_EQ(back.attention.ops_per_s, 4.5e10);
  EXPECT_DOUBLE_EQ(hardware_from_profile(back, "test").attention_ops, 4.5e10);
  nlohmann::json bad = j;
  bad["attention"]["ops_per_s"] = 0;
  EXPECT_THROW(profile_from_json(bad), std::invalid_argument);
  nlohmann::json old = j;
  old.erase("attention");
  EXPECT_EQ(profile_from_json(old).attention.ops_per_s, 0.0);  // older profiles still load
}

// ---- CLI -------------------------------------------------------------------------

TEST(PlanCli, PresetTextAndJson) {
  if (!std::filesystem::exists(KVS_BINARY)) GTEST_SKIP() << "kvserve not built yet";
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"plan", "--preset", "llama-2-70b", "--mem", "192GiB", "--bandwidth", "80GB/s", "--flops",
                               "1T", "--json"},
                              &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["kv"]["bytes_per_token"], 327680);
  EXPECT_EQ(test::run_kvserve({"plan", "--preset", "llama-2-70b", "--mem", "24GiB", "--bandwidth", "80GB/s"}, &out, &err),
            1);
  EXPECT_NE(err.find("cannot hold the weights"), std::string::npos) << err;
  EXPECT_NE(test::run_kvserve({"plan", "--preset", "llama-2-7b", "--mem", "24 GiB"}, &out, &err), 0);
  EXPECT_NE(err.find("invalid size"), std::string::npos) << err;
  EXPECT_NE(test::run_kvserve({"plan"}, &out, &err), 0);
}

TEST(PlanCli, GgufWithPlots) {
  if (!std::filesystem::exists(KVS_BINARY)) GTEST_SKIP() << "kvserve not built yet";
  if (!test::shared_available()) GTEST_SKIP() << "no ../shared";
  const std::string dir = test::temp_dir() + "/cli_svg";
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"plan", "-m", test::shared("models/stories260K/stories260K.gguf"), "--mem", "1GiB",
                               "--bandwidth", "20GB/s", "--flops", "100G", "--svg", dir},
                              &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("640"), std::string::npos) << out;  // f16 bytes per token
  EXPECT_TRUE(std::filesystem::exists(dir + "/decode_roofline.svg"));
}

// The hybrid KV cache of the Gemma 3 27B shape (62 layers, every sixth
// global, 1,024-token windows; 16 KV heads x 128): seven tables of ten layer
// slots; at 32k one sequence needs 2,048 blocks in the full table and
// ceil(1024/16) + 1 = 65 in each windowed one, against every layer at full
// size, f16: 2048 x 16 x 62 x 8192 B. Admission counts each table's blocks.
TEST(Plan, Gemma3HybridKvAtItsWindows) {
  PlanInput in = preset_input("gemma-3-27b", "q4_0");
  in.hw.mem_bytes = 64ull << 30;
  in.ctx = 32768;
  in.prompt = 30000;
  in.max_tokens = 2000;
  const PlanResult p = make_plan(in);
  ASSERT_EQ(p.hybrid.tables.size(), 7u);
  EXPECT_EQ(p.hybrid.tables[0].window, 0);
  EXPECT_EQ(p.hybrid.tables[0].slots, 10);
  EXPECT_EQ(p.hybrid.tables[6].window, 1024);
  EXPECT_EQ(p.hybrid.layer_token_bytes, 8192u);
  ASSERT_EQ(p.hybrid.rows.size(), 2u);  // 8k and 32k (the plan's context is one of them)
  const HybridKvRow& r = p.hybrid.rows[1];
  EXPECT_EQ(r.ctx, 32768);
  EXPECT_EQ(r.full_bytes, 2048ull * 16 * 62 * 8192);
  EXPECT_EQ(r.hybrid_bytes, (2048ull + 6 * 65) * 10 * 16 * 8192);
  EXPECT_EQ(r.bound_bytes, (2048ull + 6 * 98) * 10 * 16 * 8192);
  EXPECT_GT(r.saving, 5.2);
  EXPECT_LT(r.saving, 5.21);
  EXPECT_EQ(p.capacity.bytes_per_block, 10ull * 16 * 8192);
  EXPECT_EQ(p.capacity.blocks_per_request, 2000 + 6 * 98);  // 32,000 tokens: 2,000 blocks; windowed at their bound
  const std::string text = format_plan(p);
  EXPECT_NE(text.find("Hybrid KV cache: 7 tables of 10 layer slots"), std::string::npos) << text;
  EXPECT_NE(text.find("5.21x"), std::string::npos) << text;
  const auto j = plan_to_json(p);
  EXPECT_EQ(j["hybrid_kv"]["sequence"][1]["hybrid_bytes"], r.hybrid_bytes);
  // One window for every layer, or none: no hybrid section.
  EXPECT_TRUE(make_plan(preset_input("llama-3-8b")).hybrid.tables.empty());

  // Decode reads each windowed layer's window, not the whole context: at
  // 32k, 10 global layers x 32,768 keys + 52 local ones x 1,024, each key
  // 16 x 128 x 2 x 2 bytes (f16 K and V); attention scores as many keys.
  const RooflinePoint d = roofline_point(p, 2, 32768);
  const double keys = 10.0 * 32768 + 52.0 * 1024;
  EXPECT_DOUBLE_EQ(d.kv_bytes, 2 * keys * 8192);
  EXPECT_DOUBLE_EQ(d.ops_per_step, 2 * (2.0 * double(p.in.model.matmul_params) + 4.0 * 32 * 128 * keys));
  // Prompts shorter than the window attend as full layers do.
  const RooflinePoint s = roofline_point(p, 1, 1000);
  EXPECT_DOUBLE_EQ(s.kv_bytes, 62.0 * 1000 * 8192);
  // Prefill of 30,000 tokens: a local layer's query sees at most 1,024 keys.
  const double P = 30000, pairs = 10 * P * (P + 1) / 2 + 52 * (1024.0 * 1025 / 2 + (P - 1024) * 1024);
  EXPECT_DOUBLE_EQ(p.prefill.ops, 2.0 * double(p.in.model.matmul_params) * P + 4.0 * 32 * 128 * pairs);
}
