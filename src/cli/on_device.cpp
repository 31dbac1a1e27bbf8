#include "cli/on_device.h"

#include <cstdio>

#include "tools/units.h"

namespace kvs::cli {

void add_device_args(CLI::App* cmd, DeviceArgs& a) {
  cmd->add_option("--procfs-root", a.roots.procfs, "Where /proc is (tests: a fake tree)")->capture_default_str();
  cmd->add_option("--sysfs-root", a.roots.sysfs, "Where /sys is (tests: a fake tree)")->capture_default_str();
  cmd->add_option("--cgroup-root", a.roots.cgroup, "Where the cgroup v2 hierarchy is mounted")->capture_default_str();
  cmd->add_option("--device-hold", a.hold_s, "Seconds every signal must stay low before the device level falls")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_flag("--no-device-monitor", a.off, "Ignore memory pressure, temperature and CPU throttling");
}

std::unique_ptr<device::DeviceMonitor> make_device_monitor(const DeviceArgs& a) {
  if (a.off) return nullptr;
  device::DeviceMonitorOptions o;
  o.roots = a.roots;
  o.hold_s = a.hold_s;
  return std::make_unique<device::DeviceMonitor>(o);
}

std::optional<tools::RamBudgetChoice> ram_budget_choice(const std::string& size, const std::string& model_path,
                                                        tools::RamBudgetInput in) {
  if (size.empty()) return std::nullopt;
  in.budget_bytes = tools::parse_size(size);
  in.model = tools::shape_from_gguf(model_path);
  const tools::RamBudgetChoice c = tools::choose_for_budget(in);
  std::fprintf(stderr, "kvserve: %s\n", c.describe().c_str());
  return c;
}

}  // namespace kvs::cli
