#include "device/device_monitor.h"

#include <cstdio>

namespace kvs::device {

std::string DeviceState::describe() const {
  std::string s = to_string(level);
  if (level != DeviceLevel::Normal) s += " (" + causes_to_string(causes) + ": " + why + ")";
  s += "; shedding: " + plan.describe();
  return s;
}

DeviceMonitor::DeviceMonitor(DeviceMonitorOptions o) : o_(std::move(o)), tracker_(o_.thresholds, o_.hold_s) {
  if (!o_.log) o_.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
}

DeviceState DeviceMonitor::poll(double now, const std::function<void(const DeviceState&)>& apply) {
  std::lock_guard<std::mutex> one(poll_mu_);
  if (last_poll_ >= 0 && now - last_poll_ < o_.min_interval_s) return state();
  last_poll_ = now;
  DeviceState next = state();  // only a poll writes st_, and this is the only one running
  next.signals = read_device_signals(o_.roots);
  const LevelTracker::Change ch = tracker_.update(next.signals, now);
  const Classified& c = tracker_.current();
  next.level = c.level;
  next.causes = c.causes;
  next.why = c.why;
  next.plan = shed_plan(c.level, c.causes);
  if (ch.changed) ++next.transitions;
  if (apply) apply(next);
  std::unique_lock<std::mutex> lk(mu_);
  for (int a = 0; a < kNumShedActions; ++a)
    if (next.plan.takes(ShedAction(a)) && !st_.plan.takes(ShedAction(a))) ++actions_[size_t(a)];
  st_ = next;
  lk.unlock();
  if (ch.changed)
    o_.log(std::string("kvserve: device ") + to_string(ch.from) + " -> " + to_string(ch.to) + " (" +
           causes_to_string(c.causes) + (c.why.empty() ? "" : ": " + c.why) + "); shedding: " + next.plan.describe());
  return next;
}

DeviceState DeviceMonitor::state() const {
  std::lock_guard<std::mutex> lk(mu_);
  return st_;
}

std::string DeviceMonitor::metrics_text() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string s;
  s += "# HELP kvserve_device_level Device level: 0 normal, 1 warm, 2 hot, 3 critical.\n";
  s += "# TYPE kvserve_device_level gauge\n";
  s += "kvserve_device_level " + std::to_string(int(st_.level)) + "\n";
  s += "# HELP kvserve_device_transitions_total Device level changes.\n";
  s += "# TYPE kvserve_device_transitions_total counter\n";
  s += "kvserve_device_transitions_total " + std::to_string(st_.transitions) + "\n";
  s += "# HELP kvserve_device_actions_total Times a shedding action was switched on.\n";
  s += "# TYPE kvserve_device_actions_total counter\n";
  for (int a = 0; a < kNumShedActions; ++a)
    s += std::string("kvserve_device_actions_total{action=\"") + to_string(ShedAction(a)) + "\"} " +
         std::to_string(actions_[size_t(a)]) + "\n";
  return s;
}

}  // namespace kvs::device
