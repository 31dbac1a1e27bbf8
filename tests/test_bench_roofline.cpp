// `kvserve bench` against the probe's roofline: the ops a prefill token
// costs, the peak and bandwidth picked for the thread count, and the columns
// the command prints with and without a profile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "test_util.h"
#include "tools/bench_roofline.h"
#include "tools/make_model.h"
#include "tools/probe.h"

using namespace kvs;
using namespace kvs::tools;

namespace {

HardwareProfile synthetic_profile() {
  HardwareProfile p;
  p.cpu = "test cpu";
  p.logical_cores = 2;
  p.mem_total_bytes = 8ull << 30;
  p.bandwidth = 30e9;
  p.bandwidth_by_threads = {{1, 12e9}, {2, 24e9}, {3, 30e9}};
  p.fp32 = {"avx512 vfmadd", {{1, 1e11}, {2, 2e11}}, 2e11};
  p.bf16 = {"avx512_bf16", {{1, 5e10}}, 5e10};
  p.int8 = {"avx512_vnni", {{1, 4e11}}, 4e11};
  return p;
}

TEST(BenchRoofline, PointAtTheThreadCountElseTheBest) {
  const HardwareProfile p = synthetic_profile();
  const BenchRoofline two = bench_roofline(p, "x", 2);
  EXPECT_DOUBLE_EQ(two.bandwidth, 24e9);
  EXPECT_DOUBLE_EQ(two.peak_fp32, 2e11);
  EXPECT_DOUBLE_EQ(two.peak_int8, 4e11);  // 2 threads not measured: the best
  const BenchRoofline five = bench_roofline(p, "x", 5);
  EXPECT_DOUBLE_EQ(five.bandwidth, 30e9);
}

// Under AMX the int8 path is the tiles': their measured peak, where the
// profile has one (VNNI's otherwise, and always under KVS_ISA=avx512), and
// its float chain runs at the FMA rate measured beside tiles.
TEST(BenchRoofline, Int8PeakOfThePathThatRuns) {
  HardwareProfile p = synthetic_profile();
  p.int8_amx = {"amx_int8 tdpbssd", {{1, 6e12}, {2, 1.2e13}}, 1.2e13};
  p.fp32_amx = {"avx512 vfmadd231ps beside amx tiles", {{1, 5e10}, {2, 1e11}}, 1e11};
  const bool amx = active_isa() == Isa::Amx;
  EXPECT_DOUBLE_EQ(bench_roofline(p, "x", 2).peak_int8, amx ? 1.2e13 : 4e11);
  EXPECT_DOUBLE_EQ(bench_roofline(p, "x", 2).peak_chain, amx ? 1e11 : 2e11);
  EXPECT_EQ(bench_roofline(p, "x", 2).int8_tiles, amx);
  set_isa_override(Isa::Avx512);
  EXPECT_DOUBLE_EQ(bench_roofline(p, "x", 2).peak_int8, 4e11);
  EXPECT_DOUBLE_EQ(bench_roofline(p, "x", 2).peak_chain, 2e11);
  EXPECT_FALSE(bench_roofline(p, "x", 2).int8_tiles);
  clear_isa_override();
  p.fp32_amx = {};  // an AMX profile from before fp32_amx: the idle FMA rate
  EXPECT_DOUBLE_EQ(bench_roofline(p, "x", 2).peak_chain, 2e11);
  p.int8_amx = {};
  EXPECT_DOUBLE_EQ(bench_roofline(p, "x", 2).peak_int8, 4e11);
}

// The exact kernels' float chain: convert, scale and FMA per output and
// block, a min's FMA, Q6_K's two halves.
TEST(BenchRoofline, ChainOperationsPerBlock) {
  EXPECT_EQ(chain_ops_per_block(GgmlType::Q8_0), 3);
  EXPECT_EQ(chain_ops_per_block(GgmlType::Q4_0), 3);
  EXPECT_EQ(chain_ops_per_block(GgmlType::Q4_1), 4);
  EXPECT_DOUBLE_EQ(chain_ops_per_block(GgmlType::Q4_K), 12.0 / 8);  // S and the mins M per super-block
  EXPECT_DOUBLE_EQ(chain_ops_per_block(GgmlType::Q6_K), 5.0 / 8);  // per super-block, not per block
  EXPECT_EQ(chain_ops_per_block(GgmlType::F16), 0);
  EXPECT_EQ(chain_ops_per_block(GgmlType::F32), 0);
}

// With bf16 matmuls the float-weight products are set against the
// AMX-BF16 peak (attention stays on fp32's); without that peak, no roofline.
TEST(BenchRoofline, Bf16MatmulsUseTheTilePeak) {
  HardwareProfile p = synthetic_profile();
  p.bf16_amx = {"amx_bf16 tdpbf16ps", {{1, 3e12}, {2, 6e12}}, 6e12};
  const BenchRoofline fp32 = bench_roofline(p, "x", 2);
  const BenchRoofline bf16 = bench_roofline(p, "x", 2, MatmulPrecision::Bf16);
  EXPECT_FALSE(fp32.bf16_matmuls);
  EXPECT_TRUE(bf16.bf16_matmuls);
  EXPECT_DOUBLE_EQ(bf16.peak_bf16_amx, 6e12);
  PrefillOps o;
  o.fp32 = 6e9, o.attention = 2e8;
  EXPECT_DOUBLE_EQ(prefill_roofline_seconds(o, fp32), (6e9 + 2e8) / 2e11);
  EXPECT_DOUBLE_EQ(prefill_roofline_seconds(o, bf16), 6e9 / 6e12 + 2e8 / 2e11);
  p.bf16_amx = {};
  EXPECT_EQ(prefill_roofline_seconds(o, bench_roofline(p, "x", 2, MatmulPrecision::Bf16)), 0.0);
}

TEST(BenchRoofline, PrefillOpsOfStories260K) {
  if (!test::shared_available()) GTEST_SKIP();
  auto m = Model::load(test::shared("models/stories260K/stories260K.gguf"));
  const ModelConfig& c = m->config();
  const double kvdim = double(c.n_kv_heads) * c.head_dim, qdim = double(c.n_heads) * c.head_dim;
  const double per_layer = 2.0 * (2 * qdim * c.dim + 2 * kvdim * c.dim + 3.0 * c.ffn_dim * c.dim);
  const int p = 64;
  const PrefillOps o = prefill_ops_per_token(*m, p);
  // F32 weights: everything on the fp32 path; the output matrix once per prompt.
  EXPECT_DOUBLE_EQ(o.int8, 0.0);
  EXPECT_DOUBLE_EQ(o.chain, 0.0);
  EXPECT_NEAR(o.fp32, c.n_layers * per_layer + 2.0 * c.n_vocab * c.dim / p, 1e-6 * o.fp32);
  EXPECT_DOUBLE_EQ(o.attention, 4.0 * c.n_layers * c.n_heads * c.head_dim * (p + 1) / 2.0);
  BenchRoofline r;
  r.peak_fp32 = 1e11;
  EXPECT_DOUBLE_EQ(prefill_roofline_seconds(o, r), o.total() / 1e11);
}

TEST(BenchRoofline, QuantizedWeightsUseTheInt8Peak) {
  if (!test::shared_available()) GTEST_SKIP();
  auto m = Model::load(test::shared("models/tiny-random/tiny-llama-q4_0.gguf"));
  const PrefillOps o = prefill_ops_per_token(*m, 16);
  ASSERT_GT(o.int8, 0.0);
  // Every int8 op is one of a 32-element block's 64; per output and block
  // 5/8 (Q6_K, whose output matrix this model has: five per super-block)
  // to 4 chain operations, and more than Q6_K's alone.
  EXPECT_GT(o.chain, o.int8 / 64 * 5 / 8 * (1 + 1e-9));
  EXPECT_LE(o.chain, o.int8 / 64 * 4 * (1 + 1e-9));
  BenchRoofline r;
  r.peak_int8 = 4e11;
  r.peak_fp32 = 1e11;
  EXPECT_EQ(prefill_roofline_seconds(o, r), 0.0) << "the chain needs its FMA rate";
  r.peak_chain = 2e11;
  r.peak_fp32 = 0;
  EXPECT_EQ(prefill_roofline_seconds(o, r), 0.0) << "attention needs the fp32 peak";
  r.peak_fp32 = 1e11;
  const double rest = (o.fp32 + o.attention) / 1e11, dots = o.int8 / 4e11, chain = 2 * o.chain / 2e11;
  // VNNI: the chain follows the dots on the same vector unit.
  EXPECT_DOUBLE_EQ(prefill_roofline_seconds(o, r), dots + chain + rest);
  // AMX tiles: the two units side by side, the slower one bounds.
  r.int8_tiles = true;
  EXPECT_DOUBLE_EQ(prefill_roofline_seconds(o, r), std::max(dots, chain) + rest);
}

// A MoE layer costs its router, the k experts each token runs and the
// shared expert; a decode token reads only those k experts' bytes.
TEST(BenchRoofline, MixtureOfExpertsCountsTheExpertsATokenRuns) {
  MakeModelOptions o;
  o.arch = "qwen2moe";
  o.out = test::temp_dir() + "/roof-moe.gguf";
  o.type = GgmlType::Q8_0;
  o.n_expert = 6;
  o.n_expert_used = 2;
  o.expert_ffn = 64;
  o.shared_ffn = 96;
  o.progress = false;
  make_random_model(o);
  auto m = Model::load(o.out);
  const ModelConfig& c = m->config();
  const double kvdim = double(c.n_kv_heads) * c.head_dim, qdim = double(c.n_heads) * c.head_dim;
  const double attn = 2.0 * (2 * qdim * c.dim + 2 * kvdim * c.dim), ffn = 2.0 * 3 * c.dim * (2 * 64 + 96);
  const double router = 2.0 * 6 * c.dim;  // F32
  const int p = 32;
  const PrefillOps ops = prefill_ops_per_token(*m, p);
  EXPECT_NEAR(ops.int8, c.n_layers * (attn + ffn) + 2.0 * c.n_vocab * c.dim / p, 1e-9 * ops.int8);
  EXPECT_NEAR(ops.fp32, c.n_layers * router, 1e-9 * ops.fp32);
  const double expert_bytes = 3.0 * 64 * row_bytes(GgmlType::Q8_0, c.dim);  // gate, up, down of one expert
  const double embd = double(row_bytes(GgmlType::Q8_0, c.dim)) * c.n_vocab;
  EXPECT_DOUBLE_EQ(decode_weight_bytes(*m), double(c.weight_bytes) - embd - c.n_layers * 4 * expert_bytes);
}

TEST(BenchRoofline, BenchPrintsItWithAProfileAndSaysHowWithout) {
  if (!test::shared_available()) GTEST_SKIP();
  const std::string prof = test::temp_dir() + "/roof/profile.json";
  save_profile(synthetic_profile(), prof);
  const std::string model = test::shared("models/stories260K/stories260K.gguf");
  std::string out, err;
  ASSERT_EQ(0, test::run_kvserve({"bench", "-m", model, "-p", "16", "-n", "4", "-r", "1", "-t", "2", "--profile",
                                  prof, "--json"},
                                 &out, &err))
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["profile"], prof);
  EXPECT_DOUBLE_EQ(j["profile_bandwidth_gb_per_s"].get<double>(), 24.0);
  EXPECT_NEAR(j["decode_bandwidth_fraction"].get<double>(), j["decode_gb_per_s"].get<double>() / 24.0, 1e-9);
  const double frac = j["pp_peak_fraction"].get<double>();
  EXPECT_NEAR(frac, j["pp_tokens_per_s"].get<double>() / j["pp_roofline_tokens_per_s"].get<double>(), 1e-9);
  EXPECT_GT(frac, 0.0);
  ASSERT_EQ(0, test::run_kvserve({"bench", "-m", model, "-p", "16", "-n", "4", "-r", "1", "--profile", prof}, &out,
                                 &err));
  EXPECT_NE(out.find("of peak"), std::string::npos) << out;
  EXPECT_NE(out.find("% of 24.0 GB/s"), std::string::npos) << out;
  // No profile: the numbers still come, the roofline columns say "—", and
  // stderr names the command that writes a profile.
  setenv("KVS_PROFILE", (test::temp_dir() + "/roof/none.json").c_str(), 1);
  const int rc = test::run_kvserve({"bench", "-m", model, "-p", "16", "-n", "4", "-r", "1", "--json"}, &out, &err);
  unsetenv("KVS_PROFILE");
  ASSERT_EQ(rc, 0) << err;
  EXPECT_FALSE(nlohmann::json::parse(out).contains("pp_peak_fraction"));
  EXPECT_NE(err.find("kvserve probe"), std::string::npos) << err;
}

}  // namespace
