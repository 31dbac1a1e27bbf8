// What the operating system says about the device right now: memory
// pressure (PSI, cgroup v2 memory), temperature (thermal zones and their trip
// points) and CPU frequency throttling. Plain reads of procfs / sysfs /
// cgroupfs text files; a file that is missing or unreadable leaves its
// signal marked absent (containers and laptops expose different subsets).
//
// The roots are options so tests (and `bench --throttle`) can point them at
// fake trees laid out like the real ones.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvs::device {

struct DeviceRoots {
  std::string procfs = "/proc";
  std::string sysfs = "/sys";
  // cgroup v2 mount; the process's own group is found through
  // <procfs>/self/cgroup, unless this folder itself holds memory.current.
  std::string cgroup = "/sys/fs/cgroup";
};

struct ThermalZone {
  std::string name;       // thermal_zoneN (its `type` when readable)
  double temp_c = 0;
  double passive_c = 0;   // lowest passive/hot trip point; 0 = none
  double critical_c = 0;  // critical trip point; 0 = none
};

struct DeviceSignals {
  bool has_psi = false;
  double psi_some_avg10 = 0, psi_full_avg10 = 0;  // percent of wall time stalled
  bool has_cgroup = false;
  int64_t mem_current = 0;
  int64_t mem_max = 0;  // 0 = "max" (no limit)
  int64_t mem_events_high = 0, mem_events_max = 0, mem_events_oom = 0, mem_events_oom_kill = 0;
  std::vector<ThermalZone> zones;
  // Lowest scaling_cur_freq / cpuinfo_max_freq over the CPUs; 1 = at full
  // speed; < 0 = unknown.
  double freq_ratio = -1;
  int cpus_read = 0;
};

DeviceSignals read_device_signals(const DeviceRoots& roots);

// Parses one PSI file's text ("some avg10=.. ..\nfull avg10=.. .."); false
// when the "some" line is missing.
bool parse_psi(const std::string& text, double& some_avg10, double& full_avg10);

}  // namespace kvs::device
