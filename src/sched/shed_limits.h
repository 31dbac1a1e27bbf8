// Limits the scheduler applies on top of its configuration while the device
// is under strain (docs/ON-DEVICE.md). Plain data: whoever watches the
// device (the serve command's DeviceMonitor) sets them through
// EngineLoop::set_shed_limits; the scheduler knows nothing of temperatures
// or memory pressure. The default changes nothing.
#pragma once

namespace kvs::sched {

struct ShedLimits {
  int level = 0;                   // the device level, for logs and metrics only
  double max_tokens_scale = 1;     // of each new request's max_tokens (default or requested)
  double batch_scale = 1;          // of --max-batch-tokens, and of --max-seqs for new admissions
  bool stop_admissions = false;    // submit() answers DeviceBusy (HTTP 429)
  bool drop_prefix_cache = false;  // cached prefix blocks are dropped when this turns on
  int threads = 0;                 // compute threads in the forward; 0 = all of the engine's
  double retry_after_s = 0;        // Retry-After of a DeviceBusy answer (the level's hold); 0 = the default
  bool operator==(const ShedLimits&) const = default;
};

}  // namespace kvs::sched
