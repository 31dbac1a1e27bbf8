// kvserve probe: quick measurements are positive and the hardware profile
// round-trips through its JSON file.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kernels/quant.h"
#include "test_util.h"
#include "tools/plan.h"
#include "tools/probe.h"

using namespace kvs;
using namespace kvs::tools;

TEST(Probe, QuickMeasurementsArePositive) {
  const RatePoint bw = measure_bandwidth(16ull << 20, 1, 1);
  EXPECT_EQ(bw.threads, 1);
  EXPECT_GT(bw.rate, 1e8);  // any machine streams faster than 100 MB/s
  for (const char* path : {"fp32", "bf16", "int8"}) {
    const PeakRate r = measure_peak(path, 1, 0.01);
    EXPECT_GT(r.peak, 1e7) << path;
    EXPECT_FALSE(r.isa.empty());
  }
  EXPECT_THROW(measure_peak("fp64", 1, 0.01), std::invalid_argument);
}

TEST(Probe, ProfileRoundTrip) {
  HardwareProfile p;
  p.cpu = "test cpu";
  p.logical_cores = 4;
  p.mem_total_bytes = 32ull << 30;
  p.bandwidth = 42e9;
  p.bandwidth_by_threads = {{1, 20e9}, {4, 42e9}};
  p.fp32 = {"avx2", {{1, 1e11}}, 1e11};
  p.bf16 = {"avx2 (no native bf16)", {{1, 1e11}}, 1e11};
  p.int8 = {"avx2", {{1, 4e11}}, 4e11};
  const std::string path = test::temp_dir() + "/sub/profile.json";
  save_profile(p, path);
  const HardwareProfile q = load_profile(path);
  EXPECT_EQ(q.cpu, "test cpu");
  EXPECT_EQ(q.mem_total_bytes, p.mem_total_bytes);
  EXPECT_DOUBLE_EQ(q.bandwidth, 42e9);
  EXPECT_DOUBLE_EQ(q.int8.peak, 4e11);
  ASSERT_EQ(q.bandwidth_by_threads.size(), 2u);
  const Hardware hw = hardware_from_profile(q, "profile");
  EXPECT_DOUBLE_EQ(hw.flops_for("int8"), 4e11);
  EXPECT_THROW(profile_from_json(nlohmann::json{{"kvserve_profile", 1}}), std::invalid_argument);
  EXPECT_THROW(load_profile(test::temp_dir() + "/missing.json"), std::runtime_error);
}

TEST(Probe, KernelMeasurementIsPositive) {
  for (const char* t : {"f16", "q8_0", "q4_0"}) {
    const KernelRate k = measure_kernel(t, 64, 256, {16, 1}, 1u << 20, 1, 2, 0.01);
    EXPECT_EQ(k.type, t);
    ASSERT_EQ(k.points.size(), 2u);
    EXPECT_EQ(k.points[0].n, 1);  // sorted
    for (const auto& q : k.points) {
      EXPECT_GT(q.ops_per_s, 1e6) << t;
      EXPECT_NEAR(q.weight_bytes_per_s, q.ops_per_s / (2.0 * q.n * 64 * 256) * double(row_bytes(std::string(t) == "f16" ? GgmlType::F16 : std::string(t) == "q8_0" ? GgmlType::Q8_0 : GgmlType::Q4_0, 256)) * 64,
                  q.weight_bytes_per_s * 1e-9);
    }
  }
  EXPECT_THROW(measure_kernel("q9_9", 64, 256, {1}, 1u << 20, 1, 1, 0.01), std::invalid_argument);
  EXPECT_THROW(measure_kernel("q4_0", 64, 100, {1}, 1u << 20, 1, 1, 0.01), std::invalid_argument);  // not whole blocks
}

TEST(Probe, AttentionMeasurementIsPositive) {
  const AttentionRate a = measure_attention(64, 1, 0.02);
  EXPECT_EQ(a.ctx, 64);
  EXPECT_GT(a.ops_per_s, 1e8);
  EXPECT_THROW(measure_attention(4, 1, 0.01), std::invalid_argument);
}

// The progress bar's total is exactly the number of measurements run_probe logs.
TEST(Probe, StagesCountTheLoggedMeasurements) {
  ProbeOptions o;
  o.buffer_bytes = 8 << 20;
  o.runs = 1;
  o.flops_seconds = 0.01;
  o.max_threads = 2;
  o.kernel_types = {"q8_0"};
  o.kernel_rows = 256;
  o.kernel_cols = 256;
  int64_t lines = 0;
  run_probe(o, [&](const std::string&) { ++lines; });
  EXPECT_EQ(lines, probe_stages(o));
}
