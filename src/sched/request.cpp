#include "sched/request.h"

namespace kvs::sched {

const char* to_string(SloClass c) { return c == SloClass::Interactive ? "interactive" : "batch"; }

std::optional<SloClass> parse_slo_class(const std::string& s) {
  if (s == "interactive") return SloClass::Interactive;
  if (s == "batch") return SloClass::Batch;
  return std::nullopt;
}

const char* to_string(RejectReason r) {
  switch (r) {
    case RejectReason::None: return "none";
    case RejectReason::Invalid: return "invalid";
    case RejectReason::ContextLength: return "context_length";
    case RejectReason::RequestShare: return "request_share";
    case RejectReason::TenantQuota: return "tenant_quota";
    case RejectReason::QueueFull: return "queue_full";
    case RejectReason::QueueTimeout: return "queue_timeout";
    case RejectReason::ShuttingDown: return "shutting_down";
    case RejectReason::DecodeNoRoom: return "decode_no_room";
    case RejectReason::DeviceBusy: return "device_busy";
  }
  return "?";
}

bool retryable(RejectReason r) {
  return r == RejectReason::TenantQuota || r == RejectReason::QueueFull || r == RejectReason::QueueTimeout ||
         r == RejectReason::ShuttingDown || r == RejectReason::DecodeNoRoom || r == RejectReason::DeviceBusy;
}

const char* to_string(FinishReason f) {
  switch (f) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Rejected: return "rejected";
    case FinishReason::Error: return "error";
    case FinishReason::HandedOff: return "handed_off";
  }
  return "?";
}

}  // namespace kvs::sched
