#include "server/dashboard_hub.h"

#include <chrono>
#include <cstdio>
#include <exception>

#include "server/sse_stream.h"

namespace kvs::server {

class DashboardHub::Stream final : public ResponseStream {
 public:
  explicit Stream(std::function<void()> wake) : wake_(std::move(wake)) {}

  // Any thread. The newest event replaces one not yet written.
  void offer(const std::string& event, bool end) {
    {
      std::lock_guard lk(mu_);
      if (gone_) return;
      if (!event.empty()) pending_ = event;
      ended_ = ended_ || end;
    }
    if (wake_) wake_();
  }
  bool gone() const {
    std::lock_guard lk(mu_);
    return gone_;
  }

  StreamOutput poll() override {
    std::lock_guard lk(mu_);
    StreamOutput out;
    out.start_stream = !started_;
    started_ = true;
    out.data.swap(pending_);
    out.done = ended_;
    return out;
  }
  void client_gone() override {
    std::lock_guard lk(mu_);
    gone_ = true;
    pending_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::function<void()> wake_;
  std::string pending_;
  bool started_ = false, ended_ = false, gone_ = false;
};

DashboardHub::DashboardHub(std::function<std::string()> sample, double period_s)
    : sample_(std::move(sample)), period_s_(period_s > 0 ? period_s : 1.0) {
  th_ = std::thread([this] { run(); });
}

DashboardHub::~DashboardHub() { stop(); }

std::shared_ptr<ResponseStream> DashboardHub::subscribe(std::function<void()> wake) {
  auto s = std::make_shared<Stream>(std::move(wake));
  std::string first;
  bool stopped;
  {
    std::lock_guard lk(mu_);
    stopped = stop_;
    first = latest_;
    if (!stopped) {
      std::erase_if(streams_, [](const std::weak_ptr<Stream>& w) { return w.expired(); });
      streams_.push_back(s);
    }
  }
  // The first poll sends the head; the latest snapshot, when there is one,
  // comes with it so the page draws at once.
  s->offer(first.empty() ? std::string() : sse_data(first), stopped);
  return s;
}

std::string DashboardHub::latest() const {
  std::lock_guard lk(mu_);
  return latest_;
}

void DashboardHub::stop() {
  std::vector<std::weak_ptr<Stream>> streams;
  {
    std::lock_guard lk(mu_);
    if (stop_ && !th_.joinable()) return;
    stop_ = true;
    streams.swap(streams_);
  }
  cv_.notify_all();
  if (th_.joinable()) th_.join();
  for (auto& w : streams)
    if (auto s = w.lock()) s->offer({}, true);
}

void DashboardHub::run() {
  const auto period = std::chrono::duration<double>(period_s_);
  auto next = std::chrono::steady_clock::now();
  while (true) {
    std::string snap;
    try {
      snap = sample_();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvserve: dashboard snapshot failed: %s\n", e.what());
    }
    std::vector<std::shared_ptr<Stream>> live;
    {
      std::lock_guard lk(mu_);
      if (!snap.empty()) latest_ = snap;
      std::erase_if(streams_, [](const std::weak_ptr<Stream>& w) { return w.expired(); });
      for (auto& w : streams_)
        if (auto s = w.lock(); s && !s->gone()) live.push_back(std::move(s));
    }
    if (!snap.empty()) {
      const std::string ev = sse_data(snap);
      for (auto& s : live) s->offer(ev, false);
    }
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;  // a slow snapshot: no catch-up burst
    std::unique_lock lk(mu_);
    if (cv_.wait_until(lk, next, [this] { return stop_; })) return;
  }
}

}  // namespace kvs::server
