// Publishes KV-cache events as vLLM's ZmqEventPublisher does, so subscribers
// written for vLLM (NVIDIA Dynamo's KV router, llm-d's prefix-cache scorer,
// SGLang's router, vLLM's example subscriber) read kvserve unchanged:
//
//   PUB socket     multipart [topic, sequence (8-byte big-endian), payload]
//                  payload = an EventBatch (events/kv_event_codec.h)
//   ROUTER socket  replay: a request [start sequence, 8-byte big-endian]
//                  is answered with every buffered [sequence, payload] from
//                  that sequence on, then [-1 as 8 bytes, empty]
//
// Sequences start at 0 per process; the first batch is an AllBlocksCleared,
// so a subscriber that sees a worker restart also sees its cache emptied.
// It is replayable at once and sent live with the next batch, once
// subscribers waiting for the new process have had time to join.
//
// Threads: offer() is called by the engine thread and never waits for the
// sockets: batches go into a bounded queue that the publisher thread drains;
// when it is full the batch is dropped and counted (a subscriber's index then
// misses those changes until blocks are stored or removed again). Both
// sockets bind (the worker is the stable end; subscribers connect).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "events/curve_keys.h"
#include "kv/kv_events.h"

namespace kvs::events {

struct PublisherOptions {
  std::string endpoint;         // PUB, e.g. tcp://127.0.0.1:5557 (port * = any free port)
  std::string replay_endpoint;  // ROUTER; empty = no replay
  std::string topic;            // first frame of every message (vLLM's default: empty)
  int block_size = 16;
  size_t queue_batches = 4096;    // engine -> publisher bound
  size_t replay_batches = 10000;  // batches kept for replay (vLLM's buffer_steps)
  int hwm = 100000;               // PUB high-water mark
  std::optional<CurveKeys> curve; // encrypt both sockets; client_keys: who may subscribe
};

class EventPublisher {
 public:
  // Binds both sockets (throws std::runtime_error naming the endpoint) and
  // starts the publisher thread.
  explicit EventPublisher(PublisherOptions opts);
  ~EventPublisher();  // publishes what is queued (briefly), then stops
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  // Engine thread; never waits on the sockets. False: the queue was full and
  // the batch was dropped.
  bool offer(std::vector<KvEvent>&& events, double ts);

  // The endpoints as bound (a wildcard port resolved).
  const std::string& endpoint() const { return bound_pub_; }
  const std::string& replay_endpoint() const { return bound_replay_; }

  struct Stats {
    int64_t batches_published = 0, events_offered = 0;
    int64_t batches_dropped = 0, events_dropped = 0;
    int64_t replay_requests = 0, replay_bad_requests = 0;
    int64_t curve_refused = 0;  // handshakes of subscribers whose key is not a client-key
  };
  Stats stats() const;
  // Prometheus text of stats(), names prefixed kvserve_kv_events_.
  std::string metrics_text() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::string bound_pub_, bound_replay_;
};

// Seconds since the Unix epoch (vLLM's batch timestamp, time.time()).
double wall_seconds();

}  // namespace kvs::events
