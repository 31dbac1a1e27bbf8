#include "server/sse_stream.h"

#include <cstdio>

namespace kvs::server {

EventQueue::EventQueue(size_t max_events, std::function<void()> wake) : max_(max_events), wake_(std::move(wake)) {}

bool EventQueue::push(sched::TokenEvent&& e) {
  std::function<void()> wake;
  bool accepted = true;
  {
    std::lock_guard lk(mu_);
    const bool final = e.finish != sched::FinishReason::None;
    if (!final && (overflow_ || q_.size() >= max_)) {
      // Refuse; wake the writer even if a wake-up is pending so that it
      // notices the overflow while its socket write is stalled.
      overflow_ = true;
      accepted = false;
      wake = wake_;
    } else {
      q_.push_back(std::move(e));
      if (!wake_pending_) {
        wake_pending_ = true;
        wake = wake_;
      }
    }
  }
  if (wake) wake();
  return accepted;
}

std::vector<sched::TokenEvent> EventQueue::take() {
  std::lock_guard lk(mu_);
  std::vector<sched::TokenEvent> out;
  out.swap(q_);
  wake_pending_ = false;
  return out;
}

bool EventQueue::overflowed() const {
  std::lock_guard lk(mu_);
  return overflow_;
}

void EventQueue::set_wake(std::function<void()> wake) {
  std::lock_guard lk(mu_);
  wake_ = std::move(wake);
}

std::string sse_data(const std::string& json_text) { return "data: " + json_text + "\n\n"; }
std::string sse_done() { return "data: [DONE]\n\n"; }

std::string http_chunk(const std::string& piece) {
  char head[24];
  std::snprintf(head, sizeof head, "%zx\r\n", piece.size());
  if (piece.empty()) return "0\r\n\r\n";
  return head + piece + "\r\n";
}

}  // namespace kvs::server
