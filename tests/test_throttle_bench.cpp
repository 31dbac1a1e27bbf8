// `kvserve bench --throttle` end to end on stories260K (a handful of tokens;
// no timing is asserted): it applies a throttle, reads the fake hot zone
// through the DeviceMonitor, and runs without and with its plan (fewer
// threads, shorter replies), reporting TPOT p50/p99 for both.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

TEST(ThrottleBench, RunsWithoutAndWithTheSheddingPlan) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared not present";
  std::string out, err;
  ASSERT_EQ(kvs::test::run_kvserve({"bench", "--throttle", "-m",
                                    kvs::test::shared("models/stories260K/stories260K.gguf"), "-n", "16", "-t", "2",
                                    "--json"},
                                   &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_NE(j["throttle"].get<std::string>().find("fake thermal zone"), std::string::npos);
  EXPECT_NE(j["device"].get<std::string>().find("hot (thermal"), std::string::npos) << j.dump();
  EXPECT_EQ(j["no_shedding"]["threads"], 2);
  EXPECT_EQ(j["shedding"]["threads"], 1);
  EXPECT_EQ(j["no_shedding"]["max_tokens"], 16);
  EXPECT_EQ(j["shedding"]["max_tokens"], 4);
  EXPECT_EQ(j["no_shedding"]["tokens"], 16);
  EXPECT_EQ(j["shedding"]["tokens"], 16);
  for (const char* k : {"no_shedding", "shedding"}) {
    EXPECT_GT(j[k]["tpot_p50_ms"].get<double>(), 0);
    EXPECT_GE(j[k]["tpot_p99_ms"].get<double>(), j[k]["tpot_p50_ms"].get<double>());
  }
}

}  // namespace
