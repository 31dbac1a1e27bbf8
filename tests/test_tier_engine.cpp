// The KV tiers with a real model (stories260K): a prompt whose blocks come
// back from the disk tier (RAM pool emptied, or a fresh engine as after a
// restart) gives logits and greedy tokens bit-identical to the cold run, for
// f32, f16 and int8 caches; and the same for every architecture.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "crypto/secret_key.h"
#include "engine/paged_engine.h"
#include "model/model.h"
#include "small_models.h"
#include "test_util.h"
#include "tiers/disk_store.h"
#include "tiers/tier_set.h"
#include "tools/make_model.h"

namespace fs = std::filesystem;
using namespace kvs;

namespace {

struct GenRun {
  std::vector<float> first_logits;
  std::vector<int32_t> tokens;
  int cached = 0, imported = 0;
};

int argmax(const float* p, int n) { return int(std::max_element(p, p + n) - p); }

GenRun generate(PagedEngine& pe, const std::vector<int32_t>& prompt, const Scope& scope, int n_gen) {
  GenRun r;
  const SeqAdmission a = pe.add(prompt, scope);
  r.cached = a.cached_tokens;
  r.imported = a.imported_tokens;
  StepResult s = pe.step({{a.seq, uncached_tail(prompt, a)}});
  EXPECT_TRUE(s.ok);
  r.first_logits.assign(s.logits_of(0), s.logits_of(0) + s.n_vocab);
  int32_t t = argmax(s.logits_of(0), s.n_vocab);
  for (int i = 0; i < n_gen; ++i) {
    r.tokens.push_back(t);
    const std::vector<int32_t> one{t};
    s = pe.step({{a.seq, one}});
    EXPECT_TRUE(s.ok);
    t = argmax(s.logits_of(0), s.n_vocab);
  }
  pe.release(a.seq);
  return r;
}

std::unique_ptr<tiers::TierSet> tier_on(const std::string& dir, const crypto::SecretKey& master, const PagedEngine& pe,
                                        const std::string& identity, const std::string& layout_desc, size_t bytes) {
  std::vector<std::unique_ptr<tiers::BlobStore>> st;
  st.push_back(std::make_unique<tiers::DiskStore>(dir, int64_t(1) << 30, int64_t(std::time(nullptr))));
  (void)pe;
  return std::make_unique<tiers::TierSet>(master, tiers::make_tier_identity(identity, layout_desc, bytes),
                                          std::move(st));
}

class TierEngine : public ::testing::TestWithParam<KvType> {};

TEST_P(TierEngine, TierHitIsBitIdenticalToColdRun) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  auto model = Model::load(test::shared("models/stories260K/stories260K.gguf"));
  Engine engine(model, EngineOptions{2});
  PagedEngineOptions o;
  o.block_size = 16;
  o.n_blocks = 64;
  o.max_ctx = 512;
  o.cache.type = GetParam();
  const KvLayout layout = kv_layout_for(engine, o.block_size, o.cache);
  const std::string dir = (fs::temp_directory_path() / ("kvs-tier-engine-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const crypto::SecretKey master = crypto::SecretKey::random();
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(101);
  for (auto& t : prompt) t = int32_t(3 + rng() % 500);
  const Scope scope = make_scope("test", "tenant");

  PagedEngine pe(engine, o);
  auto tier = tier_on(dir, master, pe, model->identity(), layout.describe(), layout.block_bytes());
  pe.set_tier(tier.get());
  const GenRun cold = generate(pe, prompt, scope, 12);
  EXPECT_EQ(cold.cached, 0);
  tier->flush();
  EXPECT_GE(tier->stats().tiers[0].stores, 6);

  auto from_tier = [&](PagedEngine& p) {
    const uint64_t ticket = p.prefetch(prompt, scope, 0);
    EXPECT_NE(ticket, 0u);
    for (int i = 0; i < 1000 && p.prefetch_pending(ticket); ++i) usleep(1000);
    return generate(p, prompt, scope, 12);
  };
  pe.drop_cached();  // RAM cold: only the tier has the prefix
  const GenRun warm = from_tier(pe);
  EXPECT_EQ(warm.cached, 96);
  EXPECT_EQ(warm.imported, 96);
  EXPECT_EQ(std::memcmp(warm.first_logits.data(), cold.first_logits.data(), cold.first_logits.size() * sizeof(float)), 0);
  EXPECT_EQ(warm.tokens, cold.tokens);

  // A fresh engine and tier over the same directory: a restart.
  tier->flush();
  pe.set_tier(nullptr);
  tier.reset();
  PagedEngine pe2(engine, o);
  auto tier2 = tier_on(dir, master, pe2, model->identity(), layout.describe(), layout.block_bytes());
  pe2.set_tier(tier2.get());
  const GenRun restarted = from_tier(pe2);
  EXPECT_EQ(restarted.imported, 96);
  EXPECT_EQ(std::memcmp(restarted.first_logits.data(), cold.first_logits.data(), cold.first_logits.size() * sizeof(float)),
            0);
  EXPECT_EQ(restarted.tokens, cold.tokens);
  pe2.set_tier(nullptr);
  tier2.reset();

  // Another KV layout over the same files: a miss, never foreign bytes.
  PagedEngine pe3(engine, o);
  auto tier3 = tier_on(dir, master, pe3, model->identity(), layout.describe() + " other", layout.block_bytes());
  pe3.set_tier(tier3.get());
  const GenRun other = from_tier(pe3);
  EXPECT_EQ(other.imported, 0);
  EXPECT_EQ(other.tokens, cold.tokens);
  pe3.set_tier(nullptr);
  tier3.reset();  // finishes its writes before the directory goes
  fs::remove_all(dir);
}

// One prompt through an engine with a disk tier: the cold run, then the
// pool emptied, the prompt's blocks prefetched from the tier, and the warm
// run; with the tier's stores and the blocks the warm run imported.
struct TierRoundTrip {
  GenRun cold, warm;
  int64_t stores = 0, imported_blocks = 0;
};

TierRoundTrip tier_round_trip(Engine& engine, const PagedEngineOptions& o, const std::vector<int32_t>& prompt,
                              int n_gen, const std::string& tag) {
  const KvLayout layout = kv_layout_for(engine, o.block_size, o.cache);
  const std::string dir = (fs::temp_directory_path() / ("kvs-tier-" + tag + "-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const crypto::SecretKey master = crypto::SecretKey::random();
  const Scope scope = make_scope("test", "tenant");
  TierRoundTrip r;
  {
    PagedEngine pe(engine, o);
    auto tier = tier_on(dir, master, pe, engine.model().identity(), layout.describe(), layout.block_bytes());
    pe.set_tier(tier.get());
    r.cold = generate(pe, prompt, scope, n_gen);
    tier->flush();
    r.stores = tier->stats().tiers[0].stores;
    pe.drop_cached();
    const uint64_t ticket = pe.prefetch(prompt, scope, 0);
    for (int i = 0; i < 1000 && pe.prefetch_pending(ticket); ++i) usleep(1000);
    const KvStats before = pe.stats().kv;
    r.warm = generate(pe, prompt, scope, n_gen);
    r.imported_blocks = pe.stats().kv.imported_blocks - before.imported_blocks;
    pe.set_tier(nullptr);
  }
  fs::remove_all(dir);
  return r;
}

void expect_same_run(const GenRun& warm, const GenRun& cold) {
  EXPECT_EQ(std::memcmp(warm.first_logits.data(), cold.first_logits.data(), cold.first_logits.size() * sizeof(float)), 0);
  EXPECT_EQ(warm.tokens, cold.tokens);
}

// A hybrid cache (a Gemma 2 shaped model made here: a full table and a table
// of 16-token windows): every table's keyed blocks go to the tier under
// their table keys, and a reload brings back what each table needs (the
// full table's six blocks, the windowed table's last one): the same logits
// and tokens as the cold run.
TEST(TierEngineHybrid, ReloadFillsEveryTable) {
  const std::string gemma2 = test::make_windowed_gemma2("tier-gemma2.gguf");
  auto model = Model::load(gemma2);
  Engine engine(model, EngineOptions{2});
  PagedEngineOptions o;
  o.n_blocks = 64;
  o.max_ctx = 256;
  o.cache.type = KvType::F16;
  ASSERT_EQ(kv_layout_for(engine, o.block_size, o.cache).n_tables(), 2);
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(101);
  for (auto& t : prompt) t = int32_t(3 + rng() % 500);
  const TierRoundTrip r = tier_round_trip(engine, o, prompt, 24, "hybrid");
  EXPECT_EQ(r.stores, 14);  // 125 tokens: seven full blocks in each table
  EXPECT_EQ(r.warm.cached, 96);
  EXPECT_EQ(r.warm.imported, 96);
  EXPECT_EQ(r.imported_blocks, 6 + 1);
  expect_same_run(r.warm, r.cold);
}

// Every architecture, a small model of each made here (windows shorter than
// the prompt, experts where it has them): the prompt's blocks reloaded from
// the disk tier into an emptied pool give the cold run's logits and greedy
// tokens, bit for bit. Where one window covers every layer (mistral, phi3)
// the hit reloads only the blocks inside it.
struct ArchTierCase {
  const char* name;
  const char* arch;
  int layers, window, experts;
  int imported;  // tokens reloaded: a window over every layer needs only its blocks
};

class TierEngineArch : public ::testing::TestWithParam<ArchTierCase> {};

TEST_P(TierEngineArch, ReloadGivesTheColdRunsBits) {
  const ArchTierCase c = GetParam();
  MakeModelOptions mo;
  mo.out = test::temp_dir() + "/tier-arch-" + c.name + ".gguf";
  mo.arch = c.arch;
  mo.dim = 64;
  mo.n_layers = c.layers;
  mo.n_heads = 4;
  mo.n_kv_heads = 2;
  mo.n_ctx = 256;
  mo.window = c.window;
  mo.n_expert = c.experts;
  mo.n_expert_used = c.experts > 0 ? 2 : 0;
  mo.type = GgmlType::Q8_0;
  mo.progress = false;
  make_random_model(mo);
  auto model = Model::load(mo.out);
  Engine engine(model, EngineOptions{2});
  PagedEngineOptions o;
  o.n_blocks = 96;
  o.max_ctx = 256;
  o.cache.type = KvType::F16;
  std::mt19937 rng(11);
  std::vector<int32_t> prompt(77);
  for (auto& t : prompt) t = int32_t(3 + rng() % 500);
  const TierRoundTrip r = tier_round_trip(engine, o, prompt, 12, std::string("arch-") + c.name);
  EXPECT_EQ(r.warm.cached, 64);  // four full blocks of the 77-token prompt
  EXPECT_EQ(r.warm.imported, c.imported);
  expect_same_run(r.warm, r.cold);
}

INSTANTIATE_TEST_SUITE_P(Archs, TierEngineArch,
                         ::testing::Values(ArchTierCase{"llama", "llama", 2, -1, 0, 64},
                                           ArchTierCase{"mistral", "mistral", 2, 24, 0, 32},
                                           ArchTierCase{"qwen2", "qwen2", 2, -1, 0, 64},
                                           ArchTierCase{"qwen3", "qwen3", 2, -1, 0, 64},
                                           ArchTierCase{"gemma2", "gemma2", 4, 20, 0, 64},
                                           ArchTierCase{"gemma3", "gemma3", 6, 20, 0, 64},
                                           ArchTierCase{"phi3", "phi3", 2, 20, 0, 32},
                                           ArchTierCase{"mixtral", "llama", 2, -1, 4, 64},
                                           ArchTierCase{"qwen2moe", "qwen2moe", 2, -1, 4, 64},
                                           ArchTierCase{"qwen3moe", "qwen3moe", 2, -1, 4, 64},
                                           ArchTierCase{"gpt_oss", "gpt-oss", 2, 20, 4, 64}),
                         [](const auto& i) { return std::string(i.param.name); });

INSTANTIATE_TEST_SUITE_P(KvTypes, TierEngine, ::testing::Values(KvType::F32, KvType::F16, KvType::Int8),
                         [](const auto& info) {
                           return std::string(info.param == KvType::F32 ? "f32" : info.param == KvType::F16 ? "f16" : "int8");
                         });

}  // namespace
