#include "cli/on_device.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "tools/units.h"

namespace kvs::cli {

void add_session_args(CLI::App* cmd, SessionArgs& a) {
  cmd->add_option("--session-dir", a.dir, "Folder of encrypted chat sessions (default: ~/.local/share/kvserve/sessions)");
  cmd->add_option("--key-file", a.key_file,
                  "Session key file, 0600, created on first use (default: SESSION_DIR/session.key; not with "
                  "--passphrase-env)");
  cmd->add_option("--passphrase-env", a.passphrase_env,
                  "Name of an environment variable holding a passphrase: sessions are keyed by Argon2id of it instead "
                  "of the key file (not with --key-file)");
}

chat::SessionKeying SessionArgs::keying() const {
  chat::SessionKeying k;
  k.key_file = key_file;
  if (!passphrase_env.empty() && !key_file.empty())
    throw std::runtime_error("--passphrase-env and --key-file are two ways to key sessions, and only one is used: "
                             "give one of them");
  if (!passphrase_env.empty()) {
    const char* v = std::getenv(passphrase_env.c_str());
    if (!v || !*v) throw std::runtime_error("--passphrase-env " + passphrase_env + ": the variable is unset or empty");
    k.passphrase = v;
  }
  return k;
}

std::string SessionArgs::folder() const { return dir.empty() ? chat::default_session_dir() : dir; }

void add_device_args(CLI::App* cmd, DeviceArgs& a, bool on_by_default) {
  a.on = on_by_default;
  cmd->add_option("--procfs-root", a.roots.procfs, "Where /proc is (tests: a fake tree)")->capture_default_str();
  cmd->add_option("--sysfs-root", a.roots.sysfs, "Where /sys is (tests: a fake tree)")->capture_default_str();
  cmd->add_option("--cgroup-root", a.roots.cgroup, "Where the cgroup v2 hierarchy is mounted")->capture_default_str();
  cmd->add_option("--device-hold", a.hold_s, "Seconds every signal must stay low before the device level falls")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_flag("--device-monitor,!--no-device-monitor", a.on,
                std::string("Shed load under memory pressure, heat and CPU throttling (docs/ON-DEVICE.md; default ") +
                    (on_by_default ? "on)" : "off)"));
}

std::unique_ptr<device::DeviceMonitor> make_device_monitor(const DeviceArgs& a) {
  if (!a.on) return nullptr;
  device::DeviceMonitorOptions o;
  o.roots = a.roots;
  o.hold_s = a.hold_s;
  return std::make_unique<device::DeviceMonitor>(o);
}

sched::ShedLimits shed_limits_for(const device::ShedPlan& p, int engine_threads, double hold_s) {
  sched::ShedLimits s;
  s.level = int(p.level);
  s.max_tokens_scale = p.max_tokens_scale;
  s.batch_scale = p.batch_scale;
  s.stop_admissions = p.stop_admissions;
  s.drop_prefix_cache = p.drop_prefix_cache;
  s.threads = p.threads_scale < 1 ? device::scaled(engine_threads, p.threads_scale) : 0;
  s.retry_after_s = p.stop_admissions ? std::max(1.0, hold_s) : 0;
  return s;
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
