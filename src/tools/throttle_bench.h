// `kvserve bench --throttle`: time per output token (p50 / p99) of a decode
// while the machine is throttled, without and with the device shedding
// policy. The throttle is real, not simulated:
//   - a cgroup v2 cpu.max quota on this process where the hierarchy lets it
//     create a child group and move into it (often not in containers);
//   - otherwise a busy child process pinned to one core, competing with one
//     of the compute threads;
//   - and, in both cases, a fake sysfs tree whose thermal zone reads "hot",
//     which the DeviceMonitor sees and answers with its plan (fewer threads,
//     shorter replies).
// The run "without" ignores the monitor; the run "with" applies its plan.
#pragma once
#include <string>

#include "engine/kv_cache.h"
#include "kvserve/engine.h"

namespace kvs::tools {

struct ThrottleBenchOptions {
  int n_tokens = 512;       // decoded per run (in replies of max_tokens each)
  int max_tokens = 512;     // one reply before shedding
  int prompt_tokens = 32;
  int busy_cpu = 0;         // core of the competing process
  bool try_cgroup = true;   // try cpu.max first
  double cpu_share = 0.5;   // cpu.max quota
  KvCacheOptions cache;
  std::string work_dir;     // fake sysfs tree goes here; empty: a temporary folder
};

struct ThrottleRun {
  std::string policy;       // "no shedding" / "shedding"
  std::string level;        // device level the monitor reported
  int threads = 0, max_tokens = 0, tokens = 0;
  double p50_s = 0, p99_s = 0;
};

struct ThrottleReport {
  std::string throttle;     // what was applied
  std::string plan;         // the monitor's plan
  ThrottleRun without, with;
};

ThrottleReport run_throttle_bench(Engine& engine, const ThrottleBenchOptions& o);
std::string format_throttle_report(const ThrottleReport& r, const std::string& model);

}  // namespace kvs::tools
