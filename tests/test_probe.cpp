// kvserve probe: quick measurements are positive and the hardware profile
// round-trips through its JSON file.
#include <gtest/gtest.h>
#include <fstream>
#include <iterator>

#include <stdexcept>
#include <string>

#include "kernels/cpu.h"
#include "kernels/decode_variant.h"
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

// On packed weights the n = 1 measurement times every decode variant and
// leaves the fastest set; the choice round-trips through the profile and is
// applied only on the CPU and ISA it was measured on.
TEST(Probe, DecodeVariantChosenStoredAndApplied) {
  reset_decode_variants();
  const KernelRate k = measure_kernel("q4_0", 64, 256, {1}, 1u << 20, 1, 2, 0.01);
  if (active_isa() == Isa::Scalar) {
    EXPECT_FALSE(k.tuned);  // nothing packed, nothing to choose
    return;
  }
  ASSERT_TRUE(k.tuned);
  EXPECT_EQ(k.decode.type, "q4_0");
  EXPECT_TRUE(is_decode_variant(k.decode.variant));
  EXPECT_EQ(decode_variant(GgmlType::Q4_0), k.decode.variant);
  EXPECT_GE(k.decode.gain, 1.0);  // the default is among the candidates

  HardwareProfile p;
  p.cpu = machine_cpu_name();
  p.mem_total_bytes = 1ull << 30;
  p.bandwidth = 1e10;
  p.decode.isa = isa_name(active_isa());
  p.decode.types.push_back({"q4_0", DecodeVariant{1, 2048}, 1.3});
  const HardwareProfile q = profile_from_json(profile_to_json(p));
  ASSERT_EQ(q.decode.types.size(), 1u);
  EXPECT_EQ(q.decode.types[0].variant, (DecodeVariant{1, 2048}));
  EXPECT_EQ(q.decode.isa, p.decode.isa);

  // The bare model name of a VM ("AMD EPYC") does not tell Zen 3 from Zen 5:
  // where /proc/cpuinfo has a family, the profile's CPU carries it and the model.
  std::ifstream cpuinfo("/proc/cpuinfo");
  const std::string info((std::istreambuf_iterator<char>(cpuinfo)), std::istreambuf_iterator<char>());
  if (info.find("\ncpu family") != std::string::npos && info.find("model name") != std::string::npos) {
    EXPECT_NE(p.cpu.find(" (family "), std::string::npos) << p.cpu;
    EXPECT_NE(p.cpu.find(" model "), std::string::npos) << p.cpu;
    // A profile that named the CPU without them (made before) is not applied.
    const std::string bare = p.cpu.substr(0, p.cpu.find(" (family "));
    reset_decode_variants();
    EXPECT_NE(apply_decode_choices(q.decode, bare).find("using the default variants"), std::string::npos);
    EXPECT_EQ(decode_variant(GgmlType::Q4_0), DecodeVariant{});
  }

  reset_decode_variants();
  const std::string other = apply_decode_choices(q.decode, "some other CPU");
  EXPECT_NE(other.find("some other CPU"), std::string::npos) << other;
  EXPECT_EQ(decode_variant(GgmlType::Q4_0), DecodeVariant{});
  DecodeChoices wrong_isa = q.decode;
  wrong_isa.isa = "scalar";
  EXPECT_FALSE(apply_decode_choices(wrong_isa, p.cpu).empty());
  EXPECT_EQ(decode_variant(GgmlType::Q4_0), DecodeVariant{});
  EXPECT_EQ(apply_decode_choices(q.decode, p.cpu), "");
  EXPECT_EQ(decode_variant(GgmlType::Q4_0), (DecodeVariant{1, 2048}));
  reset_decode_variants();

  nlohmann::json bad = profile_to_json(p);
  bad["decode_variants"]["types"]["q4_0"]["panels"] = 3;  // not a candidate
  EXPECT_THROW(profile_from_json(bad), std::invalid_argument);
}
