// --ram-budget (src/tools/ram_budget.h): int8 when the full context fits,
// int4 when only it does, then fewer sequences and a shorter hard cap; a
// clear refusal when the weights alone do not fit; the KV heads against the
// MHA equivalent; the choice fits the budget exactly.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tools/presets.h"
#include "tools/ram_budget.h"
#include "tools/units.h"

using namespace kvs;
using namespace kvs::tools;

namespace {

// A Llama-style GQA shape: 22 layers, 32 query heads over 4 KV heads.
ModelShape tinyllama_like() {
  ModelShape m;
  m.name = "gqa";
  m.n_layers = 22;
  m.n_heads = 32;
  m.n_kv_heads = 4;
  m.head_dim = 64;
  m.dim = 2048;
  m.ffn_dim = 5632;
  m.n_vocab = 32000;
  m.n_ctx = 2048;
  m.weight_bytes = 600ull << 20;
  return m;
}

RamBudgetInput input(uint64_t budget, int batch = 1) {
  RamBudgetInput in;
  in.budget_bytes = budget;
  in.model = tinyllama_like();
  in.want_batch = batch;
  return in;
}

void expect_fits(const RamBudgetChoice& c) {
  EXPECT_LE(c.weight_bytes + c.scratch_bytes + c.kv_bytes, c.budget_bytes) << c.describe();
  EXPECT_EQ(c.kv_bytes, uint64_t(c.kv_blocks) * ram_budget_layout(tinyllama_like(), c.kv_type, 16).block_bytes());
  EXPECT_GE(c.kv_blocks, int64_t(c.batch) * ((c.hard_cap + 15) / 16));
}

TEST(RamBudget, Int8WhenTheFullContextFits) {
  const RamBudgetChoice c = choose_for_budget(input(1ull << 30));
  EXPECT_EQ(c.kv_type, KvType::Int8);
  EXPECT_EQ(c.hard_cap, 2048);
  EXPECT_EQ(c.window, 1024);
  EXPECT_EQ(c.max_tokens, 256);
  EXPECT_NE(c.quality.find("int8"), std::string::npos);
  EXPECT_TRUE(c.notes.empty());
  expect_fits(c);
}

TEST(RamBudget, Int4WhenOnlyItHoldsTheBatch) {
  // 8 sequences of 2048 tokens: int8 would need about 8 × 2048 × 24 KiB.
  RamBudgetInput in = input(1ull << 30, 8);
  const RamBudgetChoice c8 = choose_for_budget(in);
  in.budget_bytes = (600ull << 20) + c8.scratch_bytes + (180ull << 20);
  const RamBudgetChoice c = choose_for_budget(in);
  EXPECT_EQ(c.kv_type, KvType::Int4) << c.describe();
  EXPECT_EQ(c.batch, 8);
  EXPECT_NE(c.quality.find("int4"), std::string::npos);
  expect_fits(c);
}

TEST(RamBudget, ShortBudgetsCutTheBatchThenTheHardCap) {
  RamBudgetInput in = input(0, 8);
  const uint64_t scratch = choose_for_budget(input(1ull << 30)).scratch_bytes;
  in.budget_bytes = (600ull << 20) + scratch + (40ull << 20);
  RamBudgetChoice c = choose_for_budget(in);
  EXPECT_EQ(c.kv_type, KvType::Int4);
  EXPECT_LT(c.batch, 8);
  EXPECT_GE(c.batch, 1);
  expect_fits(c);
  in = input((600ull << 20) + scratch + (4ull << 20));
  c = choose_for_budget(in);
  EXPECT_EQ(c.batch, 1);
  EXPECT_LT(c.hard_cap, 2048);
  EXPECT_GE(c.hard_cap, 64);
  EXPECT_EQ(c.max_tokens, c.hard_cap / 4);
  expect_fits(c);
}

TEST(RamBudget, RefusesWhenTheWeightsAloneDoNotFit) {
  try {
    choose_for_budget(input(512ull << 20));
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot hold the weights alone"), std::string::npos) << m;
    EXPECT_NE(m.find("600 MiB"), std::string::npos) << m;
  }
  // Weights fit but leave no room for even a short KV.
  EXPECT_THROW(choose_for_budget(input((600ull << 20) + (1ull << 20))), std::runtime_error);
}

TEST(RamBudget, ReportsKvHeadsAgainstTheMhaEquivalent) {
  const RamBudgetChoice c = choose_for_budget(input(1ull << 30));
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.n_heads, 32);
  EXPECT_NEAR(c.mha_bytes_per_token / c.kv_bytes_per_token, 8.0, 0.01);
  EXPECT_NE(c.describe().find("4 KV heads for 32 query heads"), std::string::npos) << c.describe();
}

TEST(RamBudget, ChatCliRefusesBeforeLoadingAndPrintsTheChoice) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  const std::string model = test::shared("models/stories260K/stories260K.gguf");
  std::string out, err;
  EXPECT_NE(test::run_kvserve({"chat", "-m", model, "--ram-budget", "100KiB", "--no-device-monitor"}, &out, &err), 0);
  EXPECT_NE(err.find("cannot hold the weights alone"), std::string::npos) << err;
  EXPECT_EQ(test::run_kvserve({"chat", "-m", model, "--ram-budget", "8MiB", "--no-device-monitor"}, &out, &err), 0)
      << err;
  EXPECT_NE(err.find("KV int8 keys/channel"), std::string::npos) << err;
  EXPECT_NE(err.find("quality price: int8"), std::string::npos) << err;
  EXPECT_NE(err.find("4 KV heads for 8 query heads"), std::string::npos) << err;
}

}  // namespace

namespace {

// The figures of docs/ON-DEVICE.md: the bench model (kvs-bench-1.1b at
// Q4_0) under 256 MiB, 512 MiB and 1 GiB, for a chat and for a server of
// 64 sequences.
TEST(RamBudget, BenchModelFigures) {
  RamBudgetInput in;
  in.model = priced_shape(find_preset("kvs-bench-1.1b"), WeightQuant::Q4_0);
  for (uint64_t mib : {256, 512}) {
    in.budget_bytes = mib << 20;
    EXPECT_THROW(choose_for_budget(in), std::runtime_error) << mib;
  }
  in.budget_bytes = 1ull << 30;
  RamBudgetChoice c = choose_for_budget(in);
  EXPECT_EQ(c.kv_type, KvType::Int8);
  EXPECT_EQ(c.hard_cap, 2048);
  EXPECT_EQ(int64_t(c.kv_bytes_per_token), 19456);
  EXPECT_EQ(int64_t(c.mha_bytes_per_token), 77824);
  in.want_batch = 64;
  c = choose_for_budget(in);
  EXPECT_EQ(c.kv_type, KvType::Int4);
  EXPECT_EQ(int64_t(c.kv_bytes_per_token), 11264);
  EXPECT_EQ(c.batch, 14);
  EXPECT_EQ(c.kv_blocks, 1867);
}

}  // namespace

// A Gemma 3 shaped model (five windowed layers per global one): the hybrid
// cache's blocks hold four layer slots, and a sequence needs the full
// table's blocks plus each windowed table's bound, so the same budget holds
// what every layer at full size cannot.
TEST(RamBudget, HybridModelCountsEachTable) {
  ModelShape m = tinyllama_like();
  m.n_layers = 24;
  m.layer_window.clear();
  for (int l = 0; l < 24; ++l) m.layer_window.push_back((l + 1) % 6 == 0 ? 0 : 256);
  RamBudgetInput in = input(900ull << 20, 8);
  in.model = m;
  const RamBudgetChoice hybrid = choose_for_budget(in);
  in.model.layer_window.clear();
  const RamBudgetChoice full = choose_for_budget(in);
  const KvLayout l = ram_budget_layout(m, hybrid.kv_type, 16);
  EXPECT_EQ(l.n_tables(), 6);  // S = 4 (the global layers): one full table, five of window 256
  EXPECT_EQ(l.slots(), 4);
  EXPECT_EQ(hybrid.kv_bytes, uint64_t(hybrid.kv_blocks) * l.block_bytes());
  EXPECT_LE(hybrid.weight_bytes + hybrid.scratch_bytes + hybrid.kv_bytes, hybrid.budget_bytes);
  // The same budget keeps int8 for the hybrid model where every-layer-full needs int4.
  EXPECT_EQ(full.kv_type, KvType::Int4) << full.describe();
  EXPECT_EQ(hybrid.kv_type, KvType::Int8) << hybrid.describe();
  EXPECT_EQ(hybrid.batch, 8);
  EXPECT_EQ(hybrid.hard_cap, 2048);
}
