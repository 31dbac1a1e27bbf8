#include "router/event_listener.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "events/kv_event_codec.h"
#include "sched/clock.h"

namespace kvs::router {

namespace {

std::string be64(int64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v = int64_t(uint64_t(v) >> 8)) s[size_t(i)] = char(uint64_t(v) & 0xff);
  return s;
}

int64_t from_be64(const zmq::message_t& m) {
  const auto* b = static_cast<const uint8_t*>(m.data());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | b[i];
  return int64_t(v);
}

}  // namespace

struct EventListener::Impl {
  const WorkerSet& workers;
  PrefixIndex& index;
  std::optional<events::CurveKeys> curve;
  double stale_s;
  zmq::context_t ctx{1};
  struct Feed {
    std::optional<zmq::socket_t> sub, dealer, monitor;
    int64_t last = -1;
    bool failing = false;  // a handshake failed since the last one that succeeded (logged once)
    std::atomic<bool> reset{false};
    double pending_since = -1;  // first request routed since the last batch
    bool connected = false;     // the stream's handshake succeeded, no disconnect since
    // Listener thread only: the start stamp of the process the stream is
    // from (its sequence 0, all blocks cleared), -1 while unknown.
    double origin_ts = -1;
    Stats stats;
  };
  std::vector<std::unique_ptr<Feed>> feeds;
  mutable std::mutex mu;  // pending_since, connected and stats
  std::atomic<bool> stop{false};
  std::thread thread;

  Impl(const WorkerSet& w, PrefixIndex& ix, std::optional<events::CurveKeys> c, double s)
      : workers(w), index(ix), curve(std::move(c)), stale_s(s) {}

  void secure(zmq::socket_t& s) {
    if (!curve) return;
    s.set(zmq::sockopt::curve_serverkey, curve->server_key);
    s.set(zmq::sockopt::curve_publickey, curve->public_key);
    s.set(zmq::sockopt::curve_secretkey, curve->secret_key);
  }

  void open(int i) {
    Feed& f = *feeds[size_t(i)];
    const WorkerSpec& w = workers.spec(i);
    f.sub.emplace(ctx, zmq::socket_type::sub);
    f.sub->set(zmq::sockopt::linger, 0);
    secure(*f.sub);
    f.sub->set(zmq::sockopt::subscribe, "");
    // Handshake outcomes of the stream: a failure is the only sign of
    // mismatched keys (the socket itself just stays silent).
    const std::string mon = "inproc://kv-events-monitor-" + std::to_string(i);
    if (zmq_socket_monitor(f.sub->handle(), mon.c_str(),
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0)
      throw std::runtime_error("cannot monitor the KV-event socket of " + w.url);
    f.monitor.emplace(ctx, zmq::socket_type::pair);
    f.monitor->set(zmq::sockopt::linger, 0);
    f.monitor->connect(mon);
    f.sub->connect(w.events);
    f.dealer.emplace(ctx, zmq::socket_type::dealer);
    f.dealer->set(zmq::sockopt::linger, 0);
    secure(*f.dealer);
    f.dealer->connect(w.replay);
  }

  void apply(int i, const events::WireBatch& b) {
    index.apply(i, b);
    std::lock_guard lk(mu);
    ++feeds[size_t(i)]->stats.batches;
    feeds[size_t(i)]->pending_since = -1;
  }

  void count(int i, int64_t Stats::*field, int64_t n = 1) {
    std::lock_guard lk(mu);
    feeds[size_t(i)]->stats.*field += n;
  }

  // At each handshake: is the publisher the process followed so far? A new
  // process's sequence 0 goes out before a subscriber is back (ZeroMQ's slow
  // joiner), and its later sequences may run below, level with or past the
  // old one's; its replay socket still holds that sequence 0, whose stamp
  // differs (an old process's buffer has moved past its own sequence 0 for
  // good, or holds the same stamp).
  void check_origin(int i) {
    Feed& f = *feeds[size_t(i)];
    const std::optional<double> start = first_stamp(i);
    if (!start) return;
    if (f.last >= 0 && *start != f.origin_ts) {
      index.clear_worker(i);
      count(i, &Stats::restarts);
      f.last = -1;  // the new process's batches so far come by replay with the next one
    }
    f.origin_ts = *start;
  }

  // Asks the worker's replay socket for its batches from `from` and hands
  // each answer (before the end marker, or a second of silence) to `take`.
  // False when the request could not be sent.
  template <class Take>
  bool ask_replay(int i, int64_t from, Take take) {
    Feed& f = *feeds[size_t(i)];
    const std::string start = be64(from);
    std::array<zmq::const_buffer, 2> req = {zmq::const_buffer(nullptr, 0), zmq::buffer(start)};
    if (!zmq::send_multipart(*f.dealer, req, zmq::send_flags::dontwait)) return false;
    for (;;) {
      zmq::pollitem_t item{f.dealer->handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(1000)) <= 0) break;
      std::vector<zmq::message_t> m;
      if (!zmq::recv_multipart(*f.dealer, std::back_inserter(m))) break;
      if (m.size() == 3 && m[1].size() == 8 && from_be64(m[1]) == -1) break;
      take(m);
    }
    return true;
  }

  // The stamp of the sequence-0 batch the worker's replay socket holds
  // (nullopt: none, or no answer within a second).
  std::optional<double> first_stamp(int i) {
    std::optional<double> ts;
    zmq::pollitem_t out{feeds[size_t(i)]->dealer->handle(), 0, ZMQ_POLLOUT, 0};
    if (zmq::poll(&out, 1, std::chrono::milliseconds(1000)) <= 0) return ts;  // the replay socket reconnects too
    ask_replay(i, 0, [&](std::vector<zmq::message_t>& m) {
      if (ts || m.size() != 3 || m[1].size() != 8 || from_be64(m[1]) != 0) return;
      const auto b = events::decode_batch(m[2].data(), m[2].size());
      if (b && !b->events.empty() && b->events[0].kind == events::WireEvent::Kind::Cleared) ts = b->ts;
    });
    return ts;
  }

  // Batches [from, to) from the worker's replay buffer.
  void replay(int i, int64_t from, int64_t to) {
    int64_t got = 0;
    ask_replay(i, from, [&](std::vector<zmq::message_t>& m) {
      if (m.size() != 3 || m[1].size() != 8) return count(i, &Stats::malformed);
      const int64_t seq = from_be64(m[1]);
      if (seq < from || seq >= to) return;
      const auto b = events::decode_batch(m[2].data(), m[2].size());
      if (!b) return count(i, &Stats::malformed);
      apply(i, *b);
      count(i, &Stats::replayed);
      ++got;
    });
    if (got < to - from) count(i, &Stats::gaps_unfilled, to - from - got);
  }

  void on_message(int i, std::vector<zmq::message_t>& m) {
    Feed& f = *feeds[size_t(i)];
    if (m.size() != 3 || m[1].size() != 8) return count(i, &Stats::malformed);
    const int64_t seq = from_be64(m[1]);
    const auto b = events::decode_batch(m[2].data(), m[2].size());
    if (!b || seq < 0) return count(i, &Stats::malformed);
    const bool restart = seq == 0 && !b->events.empty() && b->events[0].kind == events::WireEvent::Kind::Cleared;
    if (restart) f.origin_ts = b->ts;
    if (f.last >= 0 && seq <= f.last && !restart) return count(i, &Stats::duplicates);
    if (f.last >= 0 && restart) count(i, &Stats::restarts);
    if (!restart && seq > f.last + 1) replay(i, f.last + 1, seq);
    apply(i, *b);
    f.last = seq;
  }

  // One event of worker i's stream monitor: handshake failures are counted
  // and the first of a run is logged with its likely cause.
  void on_monitor(int i) {
    Feed& f = *feeds[size_t(i)];
    std::vector<zmq::message_t> m;
    if (!zmq::recv_multipart(*f.monitor, std::back_inserter(m), zmq::recv_flags::dontwait) || m.empty() ||
        m[0].size() < 6)
      return;
    uint16_t event = 0;  // the frame: event (16 bits), value (32 bits)
    std::memcpy(&event, m[0].data(), 2);
    {
      std::lock_guard lk(mu);
      f.connected = event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
    }
    if (event == ZMQ_EVENT_DISCONNECTED) return;
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      check_origin(i);
      if (f.failing) std::fprintf(stderr, "kvserve router: worker %s: KV-event handshake succeeded\n",
                                  workers.spec(i).url.c_str());
      f.failing = false;
      return;
    }
    count(i, &Stats::handshake_failures);
    if (f.failing) return;
    f.failing = true;
    const char* why = event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                          ? "the worker refused this router's CURVE key (not among its client-key lines)"
                          : curve ? "CURVE keys do not match (the server-key is not the worker's public key, or "
                                    "the worker does not use --kv-events-curve)"
                                  : "the worker uses CURVE and this router has no --kv-events-curve";
    std::fprintf(stderr, "kvserve router: worker %s: KV-event handshake failed: %s; no events from it until this "
                 "is fixed (it is still routed, scored from this router's placements)\n",
                 workers.spec(i).url.c_str(), why);
  }

  void run() {
    while (!stop) {
      std::vector<zmq::pollitem_t> items;
      std::vector<int> who;
      for (int i = 0; i < int(feeds.size()); ++i) {
        Feed& f = *feeds[size_t(i)];
        if (f.reset.exchange(false)) {
          index.clear_worker(i);
          f.last = -1;
        }
        if (!f.sub) continue;
        items.push_back({f.sub->handle(), 0, ZMQ_POLLIN, 0});
        items.push_back({f.monitor->handle(), 0, ZMQ_POLLIN, 0});
        who.push_back(i);
      }
      if (items.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
      for (size_t k = 0; k < who.size(); ++k) {
        if (items[2 * k + 1].revents & ZMQ_POLLIN) on_monitor(who[k]);
        if (!(items[2 * k].revents & ZMQ_POLLIN)) continue;
        std::vector<zmq::message_t> m;
        if (zmq::recv_multipart(*feeds[size_t(who[k])]->sub, std::back_inserter(m), zmq::recv_flags::dontwait))
          on_message(who[k], m);
      }
    }
  }
};

EventListener::EventListener(const WorkerSet& workers, PrefixIndex& index, std::optional<events::CurveKeys> curve,
                             double stale_s)
    : impl_(std::make_unique<Impl>(workers, index, std::move(curve), stale_s)) {
  for (int i = 0; i < workers.size(); ++i) {
    impl_->feeds.push_back(std::make_unique<Impl::Feed>());
    if (!workers.spec(i).events.empty()) impl_->open(i);
  }
}

EventListener::~EventListener() {
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
}

void EventListener::start() {
  impl_->thread = std::thread([m = impl_.get()] {
    try {
      m->run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvserve router: event listener stopped: %s\n", e.what());
    }
  });
}

void EventListener::reset(int i) { impl_->feeds[size_t(i)]->reset = true; }

void EventListener::routed(int i) {
  std::lock_guard lk(impl_->mu);
  double& p = impl_->feeds[size_t(i)]->pending_since;
  if (p < 0) p = sched::steady_now();
}

bool EventListener::live(int i) const {
  if (impl_->workers.spec(i).events.empty()) return true;
  std::lock_guard lk(impl_->mu);
  const double p = impl_->feeds[size_t(i)]->pending_since;
  return p < 0 || sched::steady_now() - p <= impl_->stale_s;
}

bool EventListener::connected(int i) const {
  std::lock_guard lk(impl_->mu);
  return impl_->feeds[size_t(i)]->connected;
}

EventListener::Stats EventListener::stats(int i) const {
  std::lock_guard lk(impl_->mu);
  return impl_->feeds[size_t(i)]->stats;
}

std::string EventListener::metrics_text() const {
  std::string o;
  const struct {
    const char* name;
    int64_t Stats::*field;
    const char* help;
  } rows[] = {{"batches_total", &Stats::batches, "KV event batches applied to the prefix index."},
              {"replayed_total", &Stats::replayed, "Batches recovered from a worker's replay socket after a gap."},
              {"duplicates_total", &Stats::duplicates, "Batches ignored: sequence already seen."},
              {"malformed_total", &Stats::malformed, "Messages ignored: not a well-formed event batch."},
              {"restarts_total", &Stats::restarts, "Worker restarts seen in the stream (sequence 0 again, or another start stamp after a reconnect)."},
              {"gaps_unfilled_total", &Stats::gaps_unfilled, "Missed batches the replay could not supply."},
              {"handshake_failures_total", &Stats::handshake_failures,
               "Failed handshakes of the event stream (CURVE keys that do not match, or refused)."}};
  for (const auto& r : rows) {
    o += std::string("# HELP kvserve_router_events_") + r.name + " " + r.help + "\n# TYPE kvserve_router_events_" +
         r.name + " counter\n";
    for (int i = 0; i < impl_->workers.size(); ++i)
      o += std::string("kvserve_router_events_") + r.name + "{worker=\"" + impl_->workers.spec(i).url + "\"} " +
           std::to_string(stats(i).*(r.field)) + "\n";
  }
  o += "# HELP kvserve_router_events_live 0 while a worker's event stream counts as stopped.\n"
       "# TYPE kvserve_router_events_live gauge\n";
  for (int i = 0; i < impl_->workers.size(); ++i)
    o += "kvserve_router_events_live{worker=\"" + impl_->workers.spec(i).url + "\"} " + (live(i) ? "1" : "0") + "\n";
  o += "# HELP kvserve_router_events_connected 1 while a worker's event stream is connected (handshake done).\n"
       "# TYPE kvserve_router_events_connected gauge\n";
  for (int i = 0; i < impl_->workers.size(); ++i)
    o += "kvserve_router_events_connected{worker=\"" + impl_->workers.spec(i).url + "\"} " +
         (connected(i) ? "1" : "0") + "\n";
  return o;
}

}  // namespace kvs::router
