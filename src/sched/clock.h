// The one monotonic clock of the serving path: seconds since an arbitrary
// epoch, as a double. The engine loop, the HTTP layer and the benchmarks time
// with it so their figures are comparable; tests inject their own clock into
// EngineLoopOptions instead.
#pragma once
#include <chrono>

namespace kvs::sched {

inline double steady_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds (the unit of every timeout option) as a deadline for Asio.
inline std::chrono::milliseconds seconds_ms(double s) { return std::chrono::milliseconds(int64_t(s * 1000)); }

}  // namespace kvs::sched
