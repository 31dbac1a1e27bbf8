#include "device/device_level.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace kvs::device {

const char* to_string(DeviceLevel l) {
  switch (l) {
    case DeviceLevel::Normal: return "normal";
    case DeviceLevel::Warm: return "warm";
    case DeviceLevel::Hot: return "hot";
    case DeviceLevel::Critical: return "critical";
  }
  return "?";
}

std::string causes_to_string(uint8_t c) {
  std::string s;
  auto add = [&](uint8_t bit, const char* n) {
    if (c & bit) s += (s.empty() ? "" : "+") + std::string(n);
  };
  add(kCauseMemory, "memory");
  add(kCauseThermal, "thermal");
  add(kCauseCpu, "cpu");
  return s.empty() ? "none" : s;
}

namespace {

std::string fmt(const char* f, double a, double b = 0) {
  char buf[96];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

// Raises `c` to level i+1 for the signal named by `why` when `hit`.
void raise(Classified& c, bool hit, int i, uint8_t cause, const std::string& why) {
  if (!hit) return;
  const auto lv = DeviceLevel(i + 1);
  if (lv > c.level) {
    c.level = lv;
    c.causes = cause;
    c.why = why;
  } else if (lv == c.level) {
    c.causes |= cause;
    c.why += ", " + why;
  }
}

void classify_memory(const DeviceSignals& s, const LevelThresholds& t, Classified& c) {
  for (int i = 0; i < 3; ++i) {
    if (s.has_psi) {
      raise(c, s.psi_some_avg10 >= t.psi_some[i], i, kCauseMemory, fmt("psi some avg10 %.1f%%", s.psi_some_avg10));
      raise(c, s.psi_full_avg10 >= t.psi_full[i], i, kCauseMemory, fmt("psi full avg10 %.1f%%", s.psi_full_avg10));
    }
    if (s.has_cgroup && s.mem_max > 0) {
      const double used = double(s.mem_current) / double(s.mem_max);
      raise(c, used >= t.mem_used[i], i, kCauseMemory, fmt("cgroup memory %.0f%% of max", 100 * used));
    }
  }
}

void classify_thermal(const DeviceSignals& s, const LevelThresholds& t, Classified& c) {
  for (const ThermalZone& z : s.zones)
    for (int i = 0; i < 3; ++i) {
      double bound = t.abs_temp_c[i];
      if (i < 2 && z.passive_c > 0) bound = z.passive_c - t.trip_margin_c[i];
      if (i == 2 && z.critical_c > 0) bound = z.critical_c - t.trip_margin_c[i];
      raise(c, z.temp_c >= bound, i, kCauseThermal, z.name + fmt(" %.1f C (bound %.1f C)", z.temp_c, bound));
    }
}

}  // namespace

Classified classify(const DeviceSignals& s, const LevelThresholds& t, int64_t prev_oom_kills) {
  Classified c;
  classify_memory(s, t, c);
  classify_thermal(s, t, c);
  if (s.freq_ratio >= 0)
    for (int i = 0; i < 3; ++i)
      raise(c, t.freq_ratio[i] > 0 && s.freq_ratio <= t.freq_ratio[i], i, kCauseCpu,
            fmt("cpu at %.0f%% of its max frequency", 100 * s.freq_ratio));
  if (prev_oom_kills >= 0 && s.has_cgroup && s.mem_events_oom_kill > prev_oom_kills)
    raise(c, true, 2, kCauseMemory, "an OOM kill in the cgroup");
  return c;
}

LevelThresholds exit_thresholds(const LevelThresholds& e) {
  LevelThresholds x = e;
  for (int i = 0; i < 3; ++i) {
    x.psi_some[i] = e.psi_some[i] * 0.5;
    x.psi_full[i] = e.psi_full[i] * 0.5;
    x.mem_used[i] = e.mem_used[i] - 0.05;
    x.abs_temp_c[i] = e.abs_temp_c[i] - 5;
    x.freq_ratio[i] = e.freq_ratio[i] > 0 ? std::min(1.0, e.freq_ratio[i] + 0.05) : 0;
  }
  // A larger margin below a trip point is a lower bound.
  x.trip_margin_c = {e.trip_margin_c[0] + 5, e.trip_margin_c[1] + 5, e.trip_margin_c[2] + 5};
  return x;
}

LevelTracker::LevelTracker(LevelThresholds enter, double hold_s)
    : enter_(enter), exit_(exit_thresholds(enter)), hold_s_(hold_s) {
  if (hold_s < 0) throw std::invalid_argument("device: the hysteresis hold must be >= 0 seconds");
}

LevelTracker::Change LevelTracker::update(const DeviceSignals& s, double now) {
  Change ch;
  ch.from = cur_.level;
  const Classified up = classify(s, enter_, oom_kills_);
  if (s.has_cgroup) oom_kills_ = s.mem_events_oom_kill;
  if (up.level > cur_.level) {
    cur_ = up;
    below_since_ = -1;
  } else {
    // Leaving a level takes every signal under its exit bound, for hold_s.
    const Classified down = classify(s, exit_);
    if (down.level < cur_.level) {
      if (below_since_ < 0) below_since_ = now;
      if (now - below_since_ >= hold_s_) {
        cur_ = down.level >= up.level ? down : up;
        below_since_ = -1;
      }
    } else {
      below_since_ = -1;
      if (up.level == cur_.level) cur_ = up;  // refresh cause and reason
    }
  }
  ch.to = cur_.level;
  ch.changed = ch.to != ch.from;
  return ch;
}

}  // namespace kvs::device
