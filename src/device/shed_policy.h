// What each device level makes the server or the chat give up, as plain
// data the caller applies to its own knobs (the scheduler's limits, the
// chat's reply budget). Levels are cumulative: hot does everything warm
// does, more strongly.
//
//   warm      shorter replies (max_tokens), smaller batches and token budget
//   hot       + fewer compute threads; under memory pressure also drop the
//             cached prefix blocks and give new sequences an int4 KV
//   critical  + no new admissions (HTTP 429 / a chat message), the smallest
//             batch
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "device/device_level.h"

namespace kvs::device {

enum class ShedAction : uint8_t { MaxTokens, Batch, Threads, DropPrefixCache, StopAdmissions, Int4Kv };
inline constexpr int kNumShedActions = 6;
// "max_tokens", "batch", "threads", "drop_prefix_cache", "stop_admissions", "int4_kv"
const char* to_string(ShedAction a);

struct ShedPlan {
  DeviceLevel level = DeviceLevel::Normal;
  double max_tokens_scale = 1;  // of each request's (or reply's) max_tokens
  double batch_scale = 1;       // of --max-batch-tokens and --max-seqs
  double threads_scale = 1;     // of the compute threads
  bool drop_prefix_cache = false;
  bool stop_admissions = false;
  bool int4_new_sequences = false;
  // Whether the plan takes `a` at all (metrics count plans that take it).
  bool takes(ShedAction a) const;
  std::string describe() const;  // "max_tokens x0.5, batch x0.75" or "none"
};

ShedPlan shed_plan(DeviceLevel level, uint8_t causes);

// Applies a scale to a positive limit, never below one.
int scaled(int limit, double scale);

}  // namespace kvs::device
