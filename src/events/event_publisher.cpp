#include "events/event_publisher.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "events/kv_event_codec.h"
#include "events/zap_handler.h"

namespace kvs::events {

namespace {

std::string be64(int64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v = int64_t(uint64_t(v) >> 8)) s[size_t(i)] = char(uint64_t(v) & 0xff);
  return s;
}

int64_t from_be64(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | b[i];
  return int64_t(v);
}

void apply_curve(zmq::socket_t& s, const std::optional<CurveKeys>& curve) {
  if (!curve) return;
  if (curve->secret_key.empty())
    throw std::runtime_error("--kv-events-curve: the key file has no secret-key (the worker needs it)");
  s.set(zmq::sockopt::curve_server, 1);
  s.set(zmq::sockopt::zap_domain, "kvserve-kv-events");
  s.set(zmq::sockopt::curve_secretkey, curve->secret_key);
}

std::string bind_socket(zmq::socket_t& s, const std::string& ep, const char* what) {
  try {
    s.bind(ep);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error(std::string(what) + " '" + ep + "': cannot bind: " + e.what());
  }
  return s.get(zmq::sockopt::last_endpoint);
}

struct Pending {
  std::vector<KvEvent> events;
  double ts = 0;
};

}  // namespace

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct EventPublisher::Impl {
  PublisherOptions opts;
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
  std::optional<ZapHandler> zap;  // with client-key lines: who may subscribe
  std::thread thread;
  std::atomic<bool> stop{false};

  mutable std::mutex mu;  // the queue and the counters
  std::deque<Pending> queue;
  Stats stats;

  std::deque<std::pair<int64_t, std::string>> buffer;  // publisher thread only
  int64_t next_seq = 0;

  // Sequence 0 (AllBlocksCleared), kept for replay from the start but sent
  // live with the first real batch: sent at bind, ZeroMQ's slow joiner lost
  // it for every subscriber, even one connected before this process started.
  std::optional<std::string> held_start;

  void send(const std::string& payload) {
    const int64_t seq = next_seq++;
    buffer.emplace_back(seq, payload);
    while (buffer.size() > opts.replay_batches) buffer.pop_front();
    if (seq == 0) {
      held_start = payload;
      return;
    }
    if (held_start) publish(0, *std::exchange(held_start, std::nullopt));
    publish(seq, payload);
  }

  void publish(int64_t seq, const std::string& payload) {
    const std::string seq_bytes = be64(seq);
    std::array<zmq::const_buffer, 3> parts = {zmq::buffer(opts.topic), zmq::buffer(seq_bytes), zmq::buffer(payload)};
    zmq::send_multipart(pub, parts, zmq::send_flags::dontwait);
    std::lock_guard lk(mu);
    ++stats.batches_published;
  }

  void serve_replay() {
    std::vector<zmq::message_t> req;
    if (!zmq::recv_multipart(*replay, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
    // [client id, empty, start sequence]: a REQ client's envelope.
    if (req.size() != 3 || req[2].size() != 8) {
      std::lock_guard lk(mu);
      ++stats.replay_bad_requests;
      return;
    }
    {
      std::lock_guard lk(mu);
      ++stats.replay_requests;
    }
    const std::string client = req[0].to_string();
    const int64_t start = from_be64(req[2].data());
    for (const auto& [seq, payload] : buffer) {
      if (seq < start) continue;
      const std::string seq_bytes = be64(seq);
      std::array<zmq::const_buffer, 4> parts = {zmq::buffer(client), zmq::const_buffer(nullptr, 0),
                                                zmq::buffer(seq_bytes), zmq::buffer(payload)};
      zmq::send_multipart(*replay, parts, zmq::send_flags::dontwait);
    }
    const std::string end_seq = be64(-1);
    std::array<zmq::const_buffer, 4> end = {zmq::buffer(client), zmq::const_buffer(nullptr, 0), zmq::buffer(end_seq),
                                            zmq::const_buffer(nullptr, 0)};
    zmq::send_multipart(*replay, end, zmq::send_flags::dontwait);
  }

  void run() {
    send(encode_batch(wall_seconds(), {}, opts.block_size, true));
    for (;;) {
      std::deque<Pending> take;
      {
        std::lock_guard lk(mu);
        take.swap(queue);
      }
      for (const Pending& p : take) send(encode_batch(p.ts, p.events, opts.block_size));
      if (take.empty() && stop.load()) return;
      poll_sockets(take.empty() ? 5 : 0);
    }
  }

  // The replay and ZAP sockets, or a short nap: either bounds a batch's delay.
  void poll_sockets(int wait_ms) {
    std::vector<zmq::pollitem_t> items;
    if (replay) items.push_back({replay->handle(), 0, ZMQ_POLLIN, 0});
    if (zap) items.push_back({zap->socket().handle(), 0, ZMQ_POLLIN, 0});
    if (items.empty()) {
      if (wait_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
      return;
    }
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(wait_ms));
    if (replay && (items[0].revents & ZMQ_POLLIN)) serve_replay();
    if (zap && (items.back().revents & ZMQ_POLLIN) && !zap->answer()) {
      std::lock_guard lk(mu);
      ++stats.curve_refused;
    }
  }
};

EventPublisher::EventPublisher(PublisherOptions opts) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opts = std::move(opts);
  m.pub.set(zmq::sockopt::sndhwm, m.opts.hwm);
  m.pub.set(zmq::sockopt::linger, 0);
  // Bound before the sockets, so that no handshake gets past it.
  if (m.opts.curve && !m.opts.curve->client_keys.empty()) m.zap.emplace(m.ctx, m.opts.curve->client_keys);
  apply_curve(m.pub, m.opts.curve);
  bound_pub_ = bind_socket(m.pub, m.opts.endpoint, "--kv-events");
  if (!m.opts.replay_endpoint.empty()) {
    m.replay.emplace(m.ctx, zmq::socket_type::router);
    m.replay->set(zmq::sockopt::linger, 0);
    apply_curve(*m.replay, m.opts.curve);
    bound_replay_ = bind_socket(*m.replay, m.opts.replay_endpoint, "--kv-events-replay");
  }
  m.thread = std::thread([&m] {
    try {
      m.run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvserve: kv-events publisher stopped: %s\n", e.what());
    }
  });
}

EventPublisher::~EventPublisher() {
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
}

bool EventPublisher::offer(std::vector<KvEvent>&& events, double ts) {
  std::lock_guard lk(impl_->mu);
  Stats& s = impl_->stats;
  s.events_offered += int64_t(events.size());
  if (impl_->queue.size() >= impl_->opts.queue_batches) {
    ++s.batches_dropped;
    s.events_dropped += int64_t(events.size());
    return false;
  }
  impl_->queue.push_back({std::move(events), ts});
  return true;
}

EventPublisher::Stats EventPublisher::stats() const {
  std::lock_guard lk(impl_->mu);
  return impl_->stats;
}

std::string EventPublisher::metrics_text() const {
  const Stats s = stats();
  std::string o;
  auto counter = [&](const char* name, const char* help, int64_t v) {
    o += std::string("# HELP kvserve_kv_events_") + name + ' ' + help + "\n# TYPE kvserve_kv_events_" + name +
         " counter\nkvserve_kv_events_" + name + ' ' + std::to_string(v) + '\n';
  };
  counter("batches_published_total", "KV event batches sent on the PUB socket.", s.batches_published);
  counter("batches_dropped_total", "KV event batches dropped because the publisher queue was full.",
          s.batches_dropped);
  counter("events_dropped_total", "Block events inside dropped batches.", s.events_dropped);
  counter("replay_requests_total", "Replay requests answered.", s.replay_requests);
  counter("replay_bad_requests_total", "Malformed replay requests ignored.", s.replay_bad_requests);
  counter("curve_refused_total", "Subscriber handshakes refused: a CURVE key not among the client-key lines.",
          s.curve_refused);
  return o;
}

}  // namespace kvs::events
