// The hand-off between the engine thread and one HTTP response.
//
// The engine loop calls a request's EventSink on its own thread and must
// never wait, so the sink only pushes into this bounded queue and wakes the
// connection's strand. When the queue is full (the client stopped reading and
// the writer stopped taking) push() refuses: the loop then cancels the
// request and frees its blocks, and the writer cuts the connection off. A
// choice's final event is always taken (the loop delivers it regardless), so
// the writer always learns how the request ended.
#pragma once
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "sched/request.h"

namespace kvs::server {

class EventQueue {
 public:
  // `wake` runs on the engine thread (outside the lock) when the writer has
  // something new to look at; it must only post work, never block.
  EventQueue(size_t max_events, std::function<void()> wake);

  // Engine thread. False when full: the request is cut off.
  bool push(sched::TokenEvent&& e);
  // Writer. Everything queued so far; re-arms the wake-up.
  std::vector<sched::TokenEvent> take();
  // The writer could not keep up at some point (the request was cancelled).
  bool overflowed() const;
  // Replaces the wake-up (the writer detaches itself when it goes away).
  void set_wake(std::function<void()> wake);

 private:
  mutable std::mutex mu_;
  std::vector<sched::TokenEvent> q_;
  size_t max_;
  bool wake_pending_ = false;
  bool overflow_ = false;
  std::function<void()> wake_;
};

// Server-Sent Events framing: "data: <json>\n\n" and the closing
// "data: [DONE]\n\n".
std::string sse_data(const std::string& json_text);
std::string sse_done();
// HTTP/1.1 chunked transfer coding of one piece ("" -> the last chunk).
std::string http_chunk(const std::string& piece);

}  // namespace kvs::server
