// `kvserve serve` on a device under strain, end to end over 127.0.0.1: a
// fake thermal tree at the critical level makes /metrics show
// kvserve_device_level 3 and new requests get HTTP 429 device_busy; once
// the zone cools (no hold) requests are served again. --ram-budget prints
// its choice and sizes the pool.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "http_client.h"
#include "kvs_process.h"
#include "test_util.h"

using kvs::test::KvsProcess;
namespace fs = std::filesystem;

namespace {

void zone(const fs::path& sys, double temp_c) {
  const fs::path z = sys / "class/thermal/thermal_zone0";
  fs::create_directories(z);
  std::ofstream(z / "temp") << int(temp_c * 1000) << "\n";
  std::ofstream(z / "trip_point_0_type") << "passive\n";
  std::ofstream(z / "trip_point_0_temp") << "80000\n";
  std::ofstream(z / "trip_point_1_type") << "critical\n";
  std::ofstream(z / "trip_point_1_temp") << "100000\n";
}

bool wait_metric(int port, const std::string& sample, double want, double timeout_s) {
  return kvs::test::eventually([&] { return kvs::test::metric_value(port, sample) == want; }, timeout_s);
}

const char* kBody = R"({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})";

TEST(ServeDevice, CriticalDeviceAnswers429ThenRecovers) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared not present";
  const fs::path root = fs::path(kvs::test::temp_dir()) / "serve-device";
  fs::remove_all(root);
  zone(root / "sys", 97);
  KvsProcess p({"serve", "-m", kvs::test::shared("models/stories260K/stories260K.gguf"), "--port", "0", "-t", "1",
                "--sysfs-root", (root / "sys").string(), "--procfs-root", (root / "proc").string(), "--cgroup-root",
                (root / "cg").string(), "--device-hold", "0", "--device-monitor"},
               "listening on");
  const int port = p.port();
  ASSERT_TRUE(wait_metric(port, "kvserve_device_level", 3, 20)) << p.log();
  kvs::test::HttpReply r = kvs::test::http_request(port, "POST", "/v1/completions", kBody);
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_NE(r.body.find("device_busy"), std::string::npos) << r.body;
  EXPECT_EQ(r.headers["retry-after"], "1");  // the level's hold (none here), at least a second
  EXPECT_EQ(kvs::test::metric_value(port, "kvserve_device_actions_total{action=\"stop_admissions\"}"), 1);
  // The dashboard shows the level (its snapshot is sampled once a second).
  bool shown = false;
  for (int i = 0; i < 40 && !shown; ++i) {
    const kvs::test::HttpReply d = kvs::test::http_request(port, "GET", "/dashboard/snapshot", "");
    shown = d.status == 200 && d.body.find("\"device\":{") != std::string::npos &&
            d.body.find("\"level\":\"critical\"") != std::string::npos;
    if (!shown) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(shown) << "the dashboard snapshot must carry the device level";
  zone(root / "sys", 40);
  ASSERT_TRUE(wait_metric(port, "kvserve_device_level", 0, 20)) << p.log();
  r = kvs::test::http_request(port, "POST", "/v1/completions", kBody);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(p.stop(), 0);
  EXPECT_NE(p.log().find("device normal -> critical (thermal"), std::string::npos) << p.log();
  EXPECT_NE(p.log().find("device critical -> normal"), std::string::npos) << p.log();
}

TEST(ServeDevice, RamBudgetSizesThePoolAndRefusesWhenWeightsDoNotFit) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared not present";
  const std::string model = kvs::test::shared("models/stories260K/stories260K.gguf");
  std::string out, err;
  EXPECT_NE(kvs::test::run_kvserve({"serve", "-m", model, "--ram-budget", "1MiB"}, &out, &err), 0);
  EXPECT_NE(err.find("cannot hold the weights alone"), std::string::npos) << err;
  KvsProcess p({"serve", "-m", model, "--port", "0", "-t", "1", "--ram-budget", "3MiB"},
               "listening on");
  // --max-seqs 64 full contexts do not fit 3 MiB in int8: int4, fewer sequences.
  const std::string line = p.lines().back();
  EXPECT_NE(line.find("KV int4 keys/channel"), std::string::npos) << line;
  const std::string blocks = p.find("([0-9]+) KV blocks of 16 tokens");
  ASSERT_FALSE(blocks.empty());
  EXPECT_NE(p.log().find("(" + blocks + " blocks of 16 tokens)"), std::string::npos) << p.log();
  EXPECT_NE(p.log().find("quality price: int4"), std::string::npos) << p.log();
  EXPECT_NE(p.log().find("note: sequences at once cut to"), std::string::npos) << p.log();
  EXPECT_EQ(p.stop(), 0);
}

}  // namespace
