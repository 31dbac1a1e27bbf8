#include "tools/throttle_bench.h"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "device/device_monitor.h"
#include "engine/latency_samples.h"
#include "engine/local_sequence.h"
#include "kernels/threadpool.h"
#include "model/model.h"

namespace kvs::tools {

namespace fs = std::filesystem;

namespace {

bool write_file(const fs::path& p, const std::string& s) {
  std::ofstream f(p);
  f << s;
  return bool(f.flush());
}

std::string read_line(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return s;
}

// A child process spinning on one core until destroyed.
class BusyLoad {
 public:
  explicit BusyLoad(int cpu) {
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("bench --throttle: fork failed");
    if (pid_ == 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      ::sched_setaffinity(0, sizeof set, &set);
      volatile unsigned long x = 0;
      for (;;) x = x + 1;
    }
  }
  ~BusyLoad() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  BusyLoad(const BusyLoad&) = delete;
  BusyLoad& operator=(const BusyLoad&) = delete;

 private:
  pid_t pid_ = -1;
};

// This process in a child cgroup with a cpu.max quota, moved back and the
// group removed on destruction. ok() is false (and nothing changed) when
// the hierarchy does not allow it.
class CpuQuota {
 public:
  explicit CpuQuota(double share) {
    const std::string self = read_line("/proc/self/cgroup");
    if (self.rfind("0::", 0) != 0) return;
    home_ = fs::path("/sys/fs/cgroup") / fs::path(self.substr(3)).relative_path();
    dir_ = home_ / ("kvserve-throttle-" + std::to_string(::getpid()));
    std::error_code ec;
    if (!fs::create_directory(dir_, ec)) return;
    const long quota = long(100000 * share);
    if (write_file(dir_ / "cpu.max", std::to_string(quota) + " 100000\n") &&
        write_file(dir_ / "cgroup.procs", std::to_string(::getpid()) + "\n")) {
      ok_ = true;
      return;
    }
    fs::remove(dir_, ec);
  }
  ~CpuQuota() {
    if (!ok_) return;
    write_file(home_ / "cgroup.procs", std::to_string(::getpid()) + "\n");
    std::error_code ec;
    fs::remove(dir_, ec);
  }
  bool ok() const { return ok_; }

 private:
  fs::path home_, dir_;
  bool ok_ = false;
};

// A sysfs tree with one thermal zone just past its passive trip point.
std::string fake_hot_sysfs(const std::string& work_dir) {
  const fs::path root =
      (work_dir.empty() ? fs::temp_directory_path() / ("kvserve-throttle-" + std::to_string(::getpid())) : fs::path(work_dir)) /
      "sys";
  const fs::path z = root / "class/thermal/thermal_zone0";
  fs::create_directories(z);
  write_file(z / "type", "x86_pkg_temp\n");
  write_file(z / "temp", "92000\n");
  write_file(z / "trip_point_0_type", "passive\n");
  write_file(z / "trip_point_0_temp", "90000\n");
  write_file(z / "trip_point_1_type", "critical\n");
  write_file(z / "trip_point_1_temp", "105000\n");
  return root.string();
}

// Decodes `total` tokens in replies of `per_reply`, each after a fresh
// prompt; the time of every token after a reply's first goes in `out`.
void decode_run(Engine& e, const ThrottleBenchOptions& o, int per_reply, LatencySamples& out) {
  using clock = std::chrono::steady_clock;
  const int nv = e.model().config().n_vocab;
  LocalSequence seq(e, o.prompt_tokens + per_reply + 1, 16, o.cache);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(3, nv - 1);
  std::vector<int32_t> prompt(size_t(o.prompt_tokens));
  for (int done = 0; done < o.n_tokens;) {
    for (auto& t : prompt) t = tok(rng);
    seq.reset();
    seq.eval(prompt.data(), o.prompt_tokens);
    const int n = std::min(per_reply, o.n_tokens - done);
    for (int i = 0; i < n; ++i) {
      const int32_t t = tok(rng);
      const auto t0 = clock::now();
      seq.eval(&t, 1);
      out.add(std::chrono::duration<double>(clock::now() - t0).count());
    }
    done += n;
  }
}

ThrottleRun measure(Engine& e, const ThrottleBenchOptions& o, const std::string& policy, int threads, int per_reply,
                    const std::string& level) {
  e.pool().set_active_threads(threads);
  LatencySamples s(size_t(o.n_tokens) + 1);
  decode_run(e, o, per_reply, s);
  e.pool().set_active_threads(e.n_threads());
  ThrottleRun r;
  r.policy = policy;
  r.level = level;
  r.threads = threads;
  r.max_tokens = per_reply;
  r.tokens = int(s.total());
  r.p50_s = s.quantile(0.5);
  r.p99_s = s.quantile(0.99);
  return r;
}

}  // namespace

ThrottleReport run_throttle_bench(Engine& e, const ThrottleBenchOptions& o) {
  if (o.n_tokens < 1 || o.max_tokens < 1 || o.prompt_tokens < 1)
    throw std::invalid_argument("bench --throttle: tokens, max tokens and prompt must be >= 1");
  ThrottleReport rep;
  device::DeviceMonitorOptions mo;
  mo.roots.sysfs = fake_hot_sysfs(o.work_dir);
  mo.roots.procfs = mo.roots.sysfs + "/no-proc";
  mo.roots.cgroup = mo.roots.sysfs + "/no-cgroup";
  mo.log = [](const std::string&) {};
  device::DeviceMonitor monitor(mo);
  const device::DeviceState st = monitor.poll(0);
  rep.plan = st.describe();
  std::unique_ptr<CpuQuota> quota;
  if (o.try_cgroup) quota = std::make_unique<CpuQuota>(o.cpu_share);
  std::unique_ptr<BusyLoad> busy;
  if (quota && quota->ok()) {
    char b[64];
    std::snprintf(b, sizeof b, "cgroup cpu.max at %.0f%% of one CPU", 100 * o.cpu_share);
    rep.throttle = b;
  } else {
    quota.reset();
    busy = std::make_unique<BusyLoad>(o.busy_cpu);
    rep.throttle = "a busy process pinned to CPU " + std::to_string(o.busy_cpu);
  }
  rep.throttle += " + a fake thermal zone at 92 C (passive trip 90 C)";
  const int all = e.n_threads();
  rep.without = measure(e, o, "no shedding", all, o.max_tokens, device::to_string(st.level));
  const int threads = st.plan.threads_scale < 1 ? device::scaled(all, st.plan.threads_scale) : all;
  const int per_reply = st.plan.max_tokens_scale < 1 ? device::scaled(o.max_tokens, st.plan.max_tokens_scale) : o.max_tokens;
  rep.with = measure(e, o, "shedding", threads, per_reply, device::to_string(st.level));
  return rep;
}

std::string format_throttle_report(const ThrottleReport& r, const std::string& model) {
  std::ostringstream s;
  s << "throttle: " << r.throttle << "\ndevice: " << r.plan << "\n\n";
  s << "| model | policy | threads | reply max tokens | tokens | TPOT p50 (ms) | TPOT p99 (ms) |\n|---|---|---|---|---|---|---|\n";
  char b[256];
  for (const ThrottleRun* x : {&r.without, &r.with}) {
    std::snprintf(b, sizeof b, "| %s | %s | %d | %d | %d | %.2f | %.2f |\n", model.c_str(), x->policy.c_str(), x->threads,
                  x->max_tokens, x->tokens, 1e3 * x->p50_s, 1e3 * x->p99_s);
    s << b;
  }
  return s.str();
}

}  // namespace kvs::tools
