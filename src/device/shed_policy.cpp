#include "device/shed_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvs::device {

const char* to_string(ShedAction a) {
  switch (a) {
    case ShedAction::MaxTokens: return "max_tokens";
    case ShedAction::Batch: return "batch";
    case ShedAction::Threads: return "threads";
    case ShedAction::DropPrefixCache: return "drop_prefix_cache";
    case ShedAction::StopAdmissions: return "stop_admissions";
    case ShedAction::Int4Kv: return "int4_kv";
  }
  return "?";
}

bool ShedPlan::takes(ShedAction a) const {
  switch (a) {
    case ShedAction::MaxTokens: return max_tokens_scale < 1;
    case ShedAction::Batch: return batch_scale < 1;
    case ShedAction::Threads: return threads_scale < 1;
    case ShedAction::DropPrefixCache: return drop_prefix_cache;
    case ShedAction::StopAdmissions: return stop_admissions;
    case ShedAction::Int4Kv: return int4_new_sequences;
  }
  return false;
}

std::string ShedPlan::describe() const {
  std::string s;
  char buf[64];
  auto add = [&](const std::string& x) { s += (s.empty() ? "" : ", ") + x; };
  if (max_tokens_scale < 1) std::snprintf(buf, sizeof buf, "max_tokens x%.2g", max_tokens_scale), add(buf);
  if (batch_scale < 1) std::snprintf(buf, sizeof buf, "batch x%.2g", batch_scale), add(buf);
  if (threads_scale < 1) std::snprintf(buf, sizeof buf, "threads x%.2g", threads_scale), add(buf);
  if (drop_prefix_cache) add("drop cached prefix blocks");
  if (int4_new_sequences) add("int4 KV for new sequences");
  if (stop_admissions) add("no new admissions");
  return s.empty() ? "none" : s;
}

ShedPlan shed_plan(DeviceLevel level, uint8_t causes) {
  ShedPlan p;
  p.level = level;
  const bool memory = causes & kCauseMemory;
  switch (level) {
    case DeviceLevel::Normal:
      break;
    case DeviceLevel::Warm:
      p.max_tokens_scale = 0.5;
      p.batch_scale = 0.75;
      break;
    case DeviceLevel::Hot:
      p.max_tokens_scale = 0.25;
      p.batch_scale = 0.5;
      p.threads_scale = 0.5;
      p.drop_prefix_cache = memory;
      p.int4_new_sequences = memory;
      break;
    case DeviceLevel::Critical:
      p.max_tokens_scale = 0.25;
      p.batch_scale = 0.25;
      p.threads_scale = 0.5;
      p.drop_prefix_cache = memory;
      p.int4_new_sequences = memory;
      p.stop_admissions = true;
      break;
  }
  return p;
}

int scaled(int limit, double scale) {
  if (limit <= 0) return limit;
  return std::max(1, int(std::lround(double(limit) * scale)));
}

}  // namespace kvs::device
