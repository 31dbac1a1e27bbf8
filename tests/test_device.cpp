// Device signals, levels and shedding (src/device): fake procfs / sysfs /
// cgroup trees laid out like the real ones; each signal reaches its level;
// hysteresis holds a level until every signal has stayed under its exit
// bound; the plan per level; the Prometheus lines and the transition log.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "device/device_monitor.h"
#include "test_util.h"

using namespace kvs::device;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s;
}

struct FakeTree {
  fs::path root;
  explicit FakeTree(const std::string& name) : root(fs::path(kvs::test::temp_dir()) / name) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  DeviceRoots roots() const { return {(root / "proc").string(), (root / "sys").string(), (root / "cg").string()}; }
  void psi(double some, double full) {
    char b[256];
    std::snprintf(b, sizeof b,
                  "some avg10=%.2f avg60=0.00 avg300=0.00 total=1\nfull avg10=%.2f avg60=0.00 avg300=0.00 total=1\n",
                  some, full);
    write(root / "proc/pressure/memory", b);
  }
  void cgroup(int64_t cur, const std::string& max, int64_t oom_kill = 0) {
    write(root / "cg/memory.current", std::to_string(cur) + "\n");
    write(root / "cg/memory.max", max + "\n");
    write(root / "cg/memory.events",
          "low 0\nhigh 3\nmax 2\noom 1\noom_kill " + std::to_string(oom_kill) + "\noom_group_kill 0\n");
  }
  void zone(int i, double temp_c, double passive_c = 0, double crit_c = 0) {
    const fs::path z = root / ("sys/class/thermal/thermal_zone" + std::to_string(i));
    write(z / "temp", std::to_string(int64_t(temp_c * 1000)) + "\n");
    write(z / "type", "acpitz\n");
    int k = 0;
    if (passive_c > 0) {
      write(z / ("trip_point_" + std::to_string(k) + "_type"), "passive\n");
      write(z / ("trip_point_" + std::to_string(k++) + "_temp"), std::to_string(int64_t(passive_c * 1000)) + "\n");
    }
    if (crit_c > 0) {
      write(z / ("trip_point_" + std::to_string(k) + "_type"), "critical\n");
      write(z / ("trip_point_" + std::to_string(k) + "_temp"), std::to_string(int64_t(crit_c * 1000)) + "\n");
    }
  }
  void cpu(int i, int64_t cur_khz, int64_t max_khz) {
    const fs::path c = root / ("sys/devices/system/cpu/cpu" + std::to_string(i) + "/cpufreq");
    write(c / "scaling_cur_freq", std::to_string(cur_khz) + "\n");
    write(c / "cpuinfo_max_freq", std::to_string(max_khz) + "\n");
  }
};

TEST(DeviceSignals, ReadsEveryFileOfAFakeTree) {
  FakeTree t("signals");
  t.psi(12.5, 3.25);
  t.cgroup(900, "1000", 0);
  t.zone(0, 45.5, 90, 105);
  t.zone(1, 61);
  t.cpu(0, 2000000, 4000000);
  t.cpu(1, 3000000, 4000000);
  write(t.root / "sys/devices/system/cpu/cpufreq/policy0/x", "not a cpu\n");
  const DeviceSignals s = read_device_signals(t.roots());
  EXPECT_TRUE(s.has_psi);
  EXPECT_DOUBLE_EQ(s.psi_some_avg10, 12.5);
  EXPECT_DOUBLE_EQ(s.psi_full_avg10, 3.25);
  ASSERT_TRUE(s.has_cgroup);
  EXPECT_EQ(s.mem_current, 900);
  EXPECT_EQ(s.mem_max, 1000);
  EXPECT_EQ(s.mem_events_high, 3);
  EXPECT_EQ(s.mem_events_oom, 1);
  ASSERT_EQ(s.zones.size(), 2u);
  EXPECT_DOUBLE_EQ(s.zones[0].temp_c, 45.5);
  EXPECT_DOUBLE_EQ(s.zones[0].passive_c, 90);
  EXPECT_DOUBLE_EQ(s.zones[0].critical_c, 105);
  EXPECT_EQ(s.zones[1].passive_c, 0);
  EXPECT_EQ(s.cpus_read, 2);
  EXPECT_DOUBLE_EQ(s.freq_ratio, 0.5);
}

TEST(DeviceSignals, MissingFilesLeaveSignalsAbsentAndMaxMeansNoLimit) {
  FakeTree t("missing");
  DeviceSignals s = read_device_signals(t.roots());
  EXPECT_FALSE(s.has_psi);
  EXPECT_FALSE(s.has_cgroup);
  EXPECT_TRUE(s.zones.empty());
  EXPECT_LT(s.freq_ratio, 0);
  t.cgroup(5, "max");
  s = read_device_signals(t.roots());
  EXPECT_TRUE(s.has_cgroup);
  EXPECT_EQ(s.mem_max, 0);
  EXPECT_EQ(classify(s, {}).level, DeviceLevel::Normal);
}

TEST(DeviceSignals, FindsTheProcessGroupThroughProcSelfCgroup) {
  FakeTree t("selfcg");
  write(t.root / "proc/self/cgroup", "0::/user.slice/app.scope\n");
  write(t.root / "cg/user.slice/app.scope/memory.current", "970\n");
  write(t.root / "cg/user.slice/app.scope/memory.max", "1000\n");
  const DeviceSignals s = read_device_signals(t.roots());
  ASSERT_TRUE(s.has_cgroup);
  EXPECT_EQ(s.mem_current, 970);
  const Classified c = classify(s, {});
  EXPECT_EQ(c.level, DeviceLevel::Critical);
  EXPECT_EQ(c.causes, kCauseMemory);
}

TEST(DeviceLevels, EachSignalReachesItsLevel) {
  DeviceSignals s;
  s.has_psi = true;
  s.psi_some_avg10 = 11;
  EXPECT_EQ(classify(s, {}).level, DeviceLevel::Warm);
  s.psi_full_avg10 = 12;
  EXPECT_EQ(classify(s, {}).level, DeviceLevel::Hot);
  s = {};
  s.zones.push_back({"z", 81, 90, 105});  // within the warm margin of the passive trip
  EXPECT_EQ(classify(s, {}).level, DeviceLevel::Warm);
  s.zones[0].temp_c = 90;
  EXPECT_EQ(classify(s, {}).level, DeviceLevel::Hot);
  s.zones[0].temp_c = 101;
  const Classified c = classify(s, {});
  EXPECT_EQ(c.level, DeviceLevel::Critical);
  EXPECT_EQ(c.causes, kCauseThermal);
  EXPECT_NE(c.why.find("101.0 C"), std::string::npos) << c.why;
  s = {};
  s.freq_ratio = 0.6;
  EXPECT_EQ(classify(s, {}).level, DeviceLevel::Hot);
  EXPECT_EQ(classify(s, {}).causes, kCauseCpu);
  s = {};
  s.has_cgroup = true;
  s.mem_events_oom_kill = 2;
  EXPECT_EQ(classify(s, {}, 1).level, DeviceLevel::Critical);
  EXPECT_EQ(classify(s, {}, 2).level, DeviceLevel::Normal);
}

TEST(DeviceLevels, HysteresisHoldsALevelUntilSignalsStayUnderTheExitBound) {
  LevelTracker tr({}, 10.0);
  DeviceSignals s;
  s.zones.push_back({"z", 91, 90, 105});
  EXPECT_TRUE(tr.update(s, 0).changed);
  EXPECT_EQ(tr.level(), DeviceLevel::Hot);
  // Just under the enter bound is still above the exit bound: stays hot.
  s.zones[0].temp_c = 89;
  EXPECT_FALSE(tr.update(s, 100).changed);
  EXPECT_EQ(tr.level(), DeviceLevel::Hot);
  // Under the exit bound, but not for long enough.
  s.zones[0].temp_c = 60;
  EXPECT_FALSE(tr.update(s, 101).changed);
  EXPECT_FALSE(tr.update(s, 105).changed);
  // A spike resets the clock.
  s.zones[0].temp_c = 88;
  tr.update(s, 106);
  s.zones[0].temp_c = 60;
  tr.update(s, 107);
  EXPECT_FALSE(tr.update(s, 116).changed);
  const LevelTracker::Change ch = tr.update(s, 117.5);
  EXPECT_TRUE(ch.changed);
  EXPECT_EQ(ch.from, DeviceLevel::Hot);
  EXPECT_EQ(ch.to, DeviceLevel::Normal);
  // Rising is immediate.
  s.zones[0].temp_c = 104;
  EXPECT_TRUE(tr.update(s, 118).changed);
  EXPECT_EQ(tr.level(), DeviceLevel::Critical);
}

TEST(ShedPolicy, LevelsAreCumulativeAndMemoryOnlyActionsNeedMemoryPressure) {
  EXPECT_EQ(shed_plan(DeviceLevel::Normal, kCauseNone).describe(), "none");
  const ShedPlan warm = shed_plan(DeviceLevel::Warm, kCauseThermal);
  EXPECT_TRUE(warm.takes(ShedAction::MaxTokens));
  EXPECT_TRUE(warm.takes(ShedAction::Batch));
  EXPECT_FALSE(warm.takes(ShedAction::Threads));
  const ShedPlan hot_thermal = shed_plan(DeviceLevel::Hot, kCauseThermal);
  EXPECT_TRUE(hot_thermal.takes(ShedAction::Threads));
  EXPECT_FALSE(hot_thermal.drop_prefix_cache);
  EXPECT_FALSE(hot_thermal.int4_new_sequences);
  const ShedPlan hot_mem = shed_plan(DeviceLevel::Hot, kCauseMemory);
  EXPECT_TRUE(hot_mem.drop_prefix_cache);
  EXPECT_TRUE(hot_mem.int4_new_sequences);
  EXPECT_FALSE(hot_mem.stop_admissions);
  EXPECT_TRUE(shed_plan(DeviceLevel::Critical, kCauseCpu).stop_admissions);
  EXPECT_EQ(scaled(512, 0.25), 128);
  EXPECT_EQ(scaled(1, 0.25), 1);
}

TEST(DeviceMonitor, LogsEveryTransitionAndExportsMetrics) {
  FakeTree t("monitor");
  t.zone(0, 50, 80, 100);
  std::vector<std::string> log;
  DeviceMonitorOptions o;
  o.roots = t.roots();
  o.hold_s = 1;
  o.min_interval_s = 0;
  o.log = [&](const std::string& l) { log.push_back(l); };
  DeviceMonitor m(o);
  EXPECT_EQ(m.poll(0).level, DeviceLevel::Normal);
  EXPECT_TRUE(log.empty());
  t.zone(0, 85, 80, 100);
  EXPECT_EQ(m.poll(1).level, DeviceLevel::Hot);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("normal -> hot (thermal"), std::string::npos) << log[0];
  EXPECT_NE(log[0].find("threads x0.5"), std::string::npos) << log[0];
  t.zone(0, 40, 80, 100);
  m.poll(2);
  EXPECT_EQ(m.poll(3.5).level, DeviceLevel::Normal);
  ASSERT_EQ(log.size(), 2u);
  t.zone(0, 85, 80, 100);
  m.poll(4);
  const std::string text = m.metrics_text();
  EXPECT_NE(text.find("kvserve_device_level 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvserve_device_actions_total{action=\"threads\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvserve_device_actions_total{action=\"stop_admissions\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("kvserve_device_transitions_total 3\n"), std::string::npos);
  EXPECT_NE(m.state().describe().find("hot (thermal"), std::string::npos);
}

TEST(DeviceMonitor, PollsCloserThanTheIntervalReuseTheReading) {
  FakeTree t("interval");
  t.zone(0, 50, 80, 100);
  DeviceMonitorOptions o;
  o.roots = t.roots();
  o.min_interval_s = 5;
  o.log = [](const std::string&) {};
  DeviceMonitor m(o);
  m.poll(0);
  t.zone(0, 85, 80, 100);
  EXPECT_EQ(m.poll(1).level, DeviceLevel::Normal);
  EXPECT_EQ(m.poll(5).level, DeviceLevel::Hot);
}

// A new reading reaches the server's shedding limits (poll's `apply`) before
// state() and the metrics show it: a client that reads level 3 from
// /metrics must meet the 429, not slip in between. Inside apply the old
// level is still what everyone else sees; after it, the new one.
TEST(DeviceMonitor, AppliesANewReadingBeforeShowingIt) {
  FakeTree t("apply");
  t.zone(0, 50, 80, 100);
  DeviceMonitorOptions o;
  o.roots = t.roots();
  o.min_interval_s = 0;
  o.log = [](const std::string&) {};
  DeviceMonitor m(o);
  m.poll(0);
  t.zone(0, 97, 80, 100);
  int calls = 0;
  const DeviceState st = m.poll(1, [&](const DeviceState& next) {
    ++calls;
    EXPECT_EQ(next.level, DeviceLevel::Critical);
    EXPECT_TRUE(next.plan.stop_admissions);
    EXPECT_EQ(m.state().level, DeviceLevel::Normal) << "shown before its plan was applied";
    const std::string text = m.metrics_text();
    EXPECT_NE(text.find("kvserve_device_level 0\n"), std::string::npos) << text;
    EXPECT_NE(text.find("kvserve_device_actions_total{action=\"stop_admissions\"} 0\n"), std::string::npos) << text;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(st.level, DeviceLevel::Critical);
  EXPECT_EQ(m.state().level, DeviceLevel::Critical);
  const std::string text = m.metrics_text();
  EXPECT_NE(text.find("kvserve_device_level 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvserve_device_actions_total{action=\"stop_admissions\"} 1\n"), std::string::npos) << text;
  m.poll(1.1, [&](const DeviceState&) { ++calls; });
  EXPECT_EQ(calls, 2) << "every reading goes to apply";
}

}  // namespace
