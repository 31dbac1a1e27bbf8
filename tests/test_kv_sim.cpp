// The KV memory simulation (paged vs contiguous reservations) and the
// --kv-memory option. The simulation drives the real KvManager, so its paged
// numbers are the allocator's, not a formula's.
#include <gtest/gtest.h>

#include "tools/kv_memory.h"
#include "tools/kv_sim.h"

using namespace kvs::tools;

namespace {

KvSimConfig small() {
  KvSimConfig c;
  c.budget_tokens = 32768;
  c.n_requests = 300;
  return c;
}

TEST(KvSim, PagedWastesUnderFourPercentAndRunsMoreSequences) {
  const auto rs = run_kv_sim_all(small());
  ASSERT_EQ(rs.size(), 3u);
  const KvSimResult &paged = rs[0], &prompt_max = rs[1], &max_ctx = rs[2];
  for (const auto& r : rs) EXPECT_EQ(r.completed, 300) << to_string(r.policy);
  EXPECT_LT(paged.waste_fraction, 0.04);
  EXPECT_GT(prompt_max.waste_fraction, paged.waste_fraction);
  EXPECT_GT(max_ctx.waste_fraction, prompt_max.waste_fraction);
  EXPECT_GT(paged.mean_running, prompt_max.mean_running);
  EXPECT_GT(prompt_max.mean_running, max_ctx.mean_running);
  // Reserving the whole context: exactly floor(budget / ctx) sequences fit.
  EXPECT_NEAR(max_ctx.mean_running, 32768 / 2560, 1e-9);
  EXPECT_LE(paged.utilization, 1.0);
}

TEST(KvSim, DeterministicAndValidated) {
  const auto a = run_kv_sim(small(), KvSimPolicy::Paged), b = run_kv_sim(small(), KvSimPolicy::Paged);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.mean_allocated, b.mean_allocated);
  KvSimConfig c = small();
  c.budget_tokens = 1000;  // cannot hold one 2560-token request
  EXPECT_THROW(run_kv_sim(c, KvSimPolicy::Paged), std::invalid_argument);
  c = small();
  c.prompt_min = 0;
  EXPECT_THROW(run_kv_sim(c, KvSimPolicy::Paged), std::invalid_argument);
  EXPECT_NE(kv_sim_table(small(), {a}).find("| paged |"), std::string::npos);
}

TEST(KvMemoryOption, SizesAndShares) {
  const uint64_t avail = 10ull << 30;
  EXPECT_EQ(parse_kv_memory("2GiB", avail), 2ull << 30);
  EXPECT_EQ(parse_kv_memory("512MiB", 0), 512ull << 20);
  EXPECT_EQ(parse_kv_memory("1500000000", 0), 1500000000ull);
  EXPECT_EQ(parse_kv_memory("40%", avail), uint64_t(double(avail) * 0.4));
  EXPECT_EQ(parse_kv_memory("0.25", avail), avail / 4);
  for (const char* bad : {"", "0", "-1GiB", "2Gb", "150%", "0%", "0.", "abc", "%", "2 GiB"})
    EXPECT_THROW(parse_kv_memory(bad, avail), std::invalid_argument) << "'" << bad << "'";
  EXPECT_GT(available_memory_bytes(), 0u);
  EXPECT_GT(parse_kv_memory("1%"), 0u);
}

}  // namespace
