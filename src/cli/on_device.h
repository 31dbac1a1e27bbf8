// Options that chat and serve share for on-device use: --ram-budget and the
// device monitor's roots (--procfs-root, --sysfs-root, --cgroup-root).
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "chat/session_store.h"
#include "device/device_monitor.h"
#include "sched/shed_limits.h"
#include "tools/ram_budget.h"

namespace kvs::cli {

// Encrypted chat sessions: --session-dir, --key-file, --passphrase-env.
struct SessionArgs {
  std::string dir, key_file, passphrase_env;
  chat::SessionKeying keying() const;  // throws when the passphrase variable is unset or empty
  std::string folder() const;          // dir, or the default
};
void add_session_args(CLI::App* cmd, SessionArgs& a);

struct DeviceArgs {
  device::DeviceRoots roots;
  bool on = true;  // chat: on unless --no-device-monitor; serve: off unless --device-monitor
  double hold_s = 10.0;
};
// `on_by_default`: whether the monitor runs without --device-monitor.
void add_device_args(CLI::App* cmd, DeviceArgs& a, bool on_by_default);
// Null when the monitor is off.
std::unique_ptr<device::DeviceMonitor> make_device_monitor(const DeviceArgs& a);

// The scheduler's share of a device plan; threads out of `engine_threads`;
// a DeviceBusy client is told to come back after the level's hold.
sched::ShedLimits shed_limits_for(const device::ShedPlan& plan, int engine_threads, double hold_s);

// --ram-budget SIZE for `model_path`: the choice (printed on stderr), or
// nullopt when `size` is empty. Throws std::runtime_error when it cannot fit;
// reads only the GGUF header, so it refuses before the weights load.
std::optional<tools::RamBudgetChoice> ram_budget_choice(const std::string& size, const std::string& model_path,
                                                        tools::RamBudgetInput in);

}  // namespace kvs::cli
