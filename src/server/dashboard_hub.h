// The dashboard's event fan-out: one thread takes a snapshot (JSON text)
// once per period and hands it to every open GET /dashboard/events stream as
// one Server-Sent Event. A stream holds at most one unsent event: a reader
// that falls behind skips to the newest snapshot instead of growing a queue,
// so a stalled browser costs one snapshot of memory.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/response_stream.h"

namespace kvs::server {

class DashboardHub {
 public:
  // `sample` runs on the hub's thread once per period (and never on two
  // threads at once); an exception skips that period.
  explicit DashboardHub(std::function<std::string()> sample, double period_s = 1.0);
  ~DashboardHub();  // stop()
  DashboardHub(const DashboardHub&) = delete;
  DashboardHub& operator=(const DashboardHub&) = delete;

  // A new event stream: the latest snapshot at once, then one per period.
  // `wake` runs on the hub's thread (or the caller's) and must only post the
  // writer's poll.
  std::shared_ptr<ResponseStream> subscribe(std::function<void()> wake);
  // The latest snapshot ("" before the first).
  std::string latest() const;
  // Every stream ends after what it holds; later streams end at once.
  // Joins the thread. Idempotent.
  void stop();

  class Stream;

 private:
  void run();

  std::function<std::string()> sample_;
  double period_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string latest_;
  std::vector<std::weak_ptr<Stream>> streams_;
  std::thread th_;
};

}  // namespace kvs::server
