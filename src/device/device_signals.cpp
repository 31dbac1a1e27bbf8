#include "device/device_signals.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvs::device {

namespace fs = std::filesystem;

namespace {

bool read_file(const fs::path& p, std::string& out) {
  std::ifstream f(p);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

bool read_int(const fs::path& p, int64_t& v) {
  std::string s;
  if (!read_file(p, s)) return false;
  try {
    size_t used = 0;
    v = std::stoll(s, &used);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

double field_after(const std::string& line, const std::string& key) {
  const size_t at = line.find(key);
  if (at == std::string::npos) return 0;
  try {
    return std::stod(line.substr(at + key.size()));
  } catch (const std::exception&) {
    return 0;
  }
}

// The process's cgroup folder: the root itself when it holds the memory
// files (a fake tree, or a container whose namespace root is its group).
fs::path cgroup_dir(const DeviceRoots& r) {
  if (fs::exists(fs::path(r.cgroup) / "memory.current")) return r.cgroup;
  std::string self;
  if (!read_file(fs::path(r.procfs) / "self" / "cgroup", self)) return r.cgroup;
  std::istringstream in(self);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("0::", 0) == 0) return fs::path(r.cgroup) / fs::path(line.substr(3)).relative_path();
  return r.cgroup;
}

void read_cgroup(const DeviceRoots& r, DeviceSignals& s) {
  const fs::path dir = cgroup_dir(r);
  if (!read_int(dir / "memory.current", s.mem_current)) return;
  s.has_cgroup = true;
  std::string max;
  if (read_file(dir / "memory.max", max) && max.rfind("max", 0) != 0) {
    try {
      s.mem_max = std::stoll(max);
    } catch (const std::exception&) {
      s.mem_max = 0;
    }
  }
  std::string ev;
  if (!read_file(dir / "memory.events", ev)) return;
  std::istringstream in(ev);
  std::string key;
  int64_t v = 0;
  while (in >> key >> v) {
    if (key == "high") s.mem_events_high = v;
    else if (key == "max") s.mem_events_max = v;
    else if (key == "oom") s.mem_events_oom = v;
    else if (key == "oom_kill") s.mem_events_oom_kill = v;
  }
}

void read_zone(const fs::path& dir, DeviceSignals& s) {
  int64_t milli = 0;
  if (!read_int(dir / "temp", milli)) return;
  ThermalZone z;
  z.name = dir.filename().string();
  std::string type;
  if (read_file(dir / "type", type) && !type.empty()) z.name += " (" + type.substr(0, type.find('\n')) + ")";
  z.temp_c = double(milli) / 1000.0;
  for (int i = 0; i < 32; ++i) {
    std::string kind;
    int64_t t = 0;
    const std::string base = "trip_point_" + std::to_string(i) + "_";
    if (!read_file(dir / (base + "type"), kind) || !read_int(dir / (base + "temp"), t)) break;
    const double c = double(t) / 1000.0;
    if (kind.rfind("critical", 0) == 0) z.critical_c = z.critical_c > 0 ? std::min(z.critical_c, c) : c;
    else if (kind.rfind("passive", 0) == 0 || kind.rfind("hot", 0) == 0)
      z.passive_c = z.passive_c > 0 ? std::min(z.passive_c, c) : c;
  }
  s.zones.push_back(std::move(z));
}

void read_thermal(const DeviceRoots& r, DeviceSignals& s) {
  const fs::path dir = fs::path(r.sysfs) / "class" / "thermal";
  std::error_code ec;
  std::vector<fs::path> zones;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("thermal_zone", 0) == 0) zones.push_back(e.path());
  std::sort(zones.begin(), zones.end());
  for (const auto& z : zones) read_zone(z, s);
}

void read_cpufreq(const DeviceRoots& r, DeviceSignals& s) {
  const fs::path dir = fs::path(r.sysfs) / "devices" / "system" / "cpu";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("cpu", 0) != 0 || n.size() < 4 || !std::isdigit(static_cast<unsigned char>(n[3]))) continue;
    int64_t cur = 0, max = 0;
    if (!read_int(e.path() / "cpufreq" / "scaling_cur_freq", cur) ||
        !read_int(e.path() / "cpufreq" / "cpuinfo_max_freq", max) || max <= 0)
      continue;
    const double ratio = std::min(1.0, double(cur) / double(max));
    s.freq_ratio = s.cpus_read == 0 ? ratio : std::min(s.freq_ratio, ratio);
    ++s.cpus_read;
  }
}

}  // namespace

bool parse_psi(const std::string& text, double& some, double& full) {
  std::istringstream in(text);
  bool seen = false;
  some = full = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("some", 0) == 0) {
      some = field_after(line, "avg10=");
      seen = true;
    } else if (line.rfind("full", 0) == 0) {
      full = field_after(line, "avg10=");
    }
  }
  return seen;
}

DeviceSignals read_device_signals(const DeviceRoots& r) {
  DeviceSignals s;
  std::string psi;
  if (read_file(fs::path(r.procfs) / "pressure" / "memory", psi))
    s.has_psi = parse_psi(psi, s.psi_some_avg10, s.psi_full_avg10);
  read_cgroup(r, s);
  read_thermal(r, s);
  read_cpufreq(r, s);
  return s;
}

}  // namespace kvs::device
