// DeviceMonitor: reads the device signals every poll, tracks the level with
// hysteresis, and turns it into a ShedPlan. Every level change is logged
// (one line: from, to, cause, the signals, the plan) and counted; the
// Prometheus lines kvserve_device_level and
// kvserve_device_actions_total{action} come from metrics_text().
//
// Thread-safe: the poller (engine loop or chat) calls poll(); any thread
// may read state() and metrics_text().
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "device/device_level.h"
#include "device/device_signals.h"
#include "device/shed_policy.h"

namespace kvs::device {

struct DeviceMonitorOptions {
  DeviceRoots roots;
  LevelThresholds thresholds;
  double hold_s = 10.0;          // hysteresis: time under the exit bounds before a level falls
  double min_interval_s = 0.5;   // polls closer than this reuse the last reading
  // One line per level change; default: stderr.
  std::function<void(const std::string&)> log;
};

struct DeviceState {
  DeviceLevel level = DeviceLevel::Normal;
  uint8_t causes = kCauseNone;
  std::string why;
  ShedPlan plan;
  DeviceSignals signals;
  int64_t transitions = 0;
  std::string describe() const;  // "hot (thermal: ...); shedding: ..."
};

class DeviceMonitor {
 public:
  explicit DeviceMonitor(DeviceMonitorOptions o);
  // Reads the signals (at most every min_interval_s) at monotonic time `now`;
  // returns the state after the reading. A new reading goes to `apply` (the
  // server's shedding limits) before state() and the metrics show it, so
  // whoever sees a level also meets its plan.
  DeviceState poll(double now, const std::function<void(const DeviceState&)>& apply = {});
  DeviceState state() const;
  std::string metrics_text() const;

 private:
  DeviceMonitorOptions o_;
  std::mutex poll_mu_;      // one poll at a time: tracker_ and last_poll_ are the poller's
  mutable std::mutex mu_;   // st_ and actions_, read by state() and metrics_text()
  LevelTracker tracker_;
  DeviceState st_;
  double last_poll_ = -1;
  std::array<int64_t, kNumShedActions> actions_{};  // plans that took each action, counted on entry
};

}  // namespace kvs::device
