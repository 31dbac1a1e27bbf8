// Device signals -> one level, normal < warm < hot < critical, with
// hysteresis: the level rises as soon as any signal crosses its "enter"
// threshold, and falls only when every signal has stayed under the lower
// "exit" thresholds for `hold_s` seconds. So a reading that hovers at a
// threshold does not flap the shedding on and off.
//
// Each level records its cause (memory, thermal or cpu) because some actions
// only help one of them: dropping cached blocks or int4 for new sequences
// frees memory but cools nothing.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "device/device_signals.h"

namespace kvs::device {

enum class DeviceLevel : uint8_t { Normal = 0, Warm = 1, Hot = 2, Critical = 3 };
inline constexpr int kNumLevels = 4;
const char* to_string(DeviceLevel l);  // "normal", "warm", "hot", "critical"

// Bit set of causes.
enum Cause : uint8_t { kCauseNone = 0, kCauseMemory = 1, kCauseThermal = 2, kCauseCpu = 4 };
std::string causes_to_string(uint8_t causes);  // "memory+thermal", "none"

// Per level warm, hot, critical (index 0..2). A level is reached when any
// signal reaches its bound.
struct LevelThresholds {
  std::array<double, 3> psi_some{10, 25, 50};    // % stalled, some avg10
  std::array<double, 3> psi_full{2, 10, 25};     // % stalled, full avg10
  std::array<double, 3> mem_used{0.80, 0.90, 0.97};  // memory.current / memory.max
  // Degrees below the zone's passive trip (warm, hot) and below its
  // critical trip (critical); zones without trips use the absolute bounds.
  std::array<double, 3> trip_margin_c{10, 0, 5};
  std::array<double, 3> abs_temp_c{75, 85, 95};
  std::array<double, 3> freq_ratio{0.85, 0.65, 0.0};  // at or below; 0 = not used
};

struct Classified {
  DeviceLevel level = DeviceLevel::Normal;
  uint8_t causes = kCauseNone;  // of this level
  std::string why;              // the signal(s) that set it, for the log
};

// The level the signals alone call for under `t`. An OOM kill counted since
// `prev_oom_kills` is critical by itself.
Classified classify(const DeviceSignals& s, const LevelThresholds& t, int64_t prev_oom_kills = -1);

// The exit thresholds: the enter ones moved by the hysteresis margins.
LevelThresholds exit_thresholds(const LevelThresholds& enter);

class LevelTracker {
 public:
  explicit LevelTracker(LevelThresholds enter = {}, double hold_s = 10.0);
  struct Change {
    bool changed = false;
    DeviceLevel from = DeviceLevel::Normal, to = DeviceLevel::Normal;
  };
  // Feeds one reading taken at `now` (seconds, monotonic).
  Change update(const DeviceSignals& s, double now);
  DeviceLevel level() const { return cur_.level; }
  const Classified& current() const { return cur_; }

 private:
  LevelThresholds enter_, exit_;
  double hold_s_;
  Classified cur_;
  double below_since_ = -1;
  int64_t oom_kills_ = -1;
};

}  // namespace kvs::device
