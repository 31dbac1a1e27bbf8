// One UCX (UCP) endpoint set with its own progress thread: a listener for
// the decode worker, outgoing connections for the prefill worker, and framed
// messages over active messages. UCX picks the transports (tcp and shared
// memory on one host, RDMA where a cluster has it); large payloads go by
// rendezvous, which the receiver lands straight in the buffer it names
// (docs/DISAGG.md, "Transport").
//
// Threads: every handler runs on the link's progress thread, and a handler
// may call send()/recv_data()/close() from there. Other threads call
// listen(), connect(), send(), close() and post(); these hand the work to the
// progress thread and never wait for the network.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kvs::disagg {

using ConnId = uint64_t;

// An arriving message's data: either here now, or (rendezvous) still at the
// sender until recv_data() names where it goes. A handler that neither
// receives nor copies it drops it.
struct Incoming {
  const void* data = nullptr;
  size_t length = 0;
  bool rndv = false;
  void* desc = nullptr;  // rendezvous descriptor (owned by UCX)
  bool taken = false;
};

class UcxLink {
 public:
  struct Handlers {
    std::function<void(ConnId)> on_accept;                             // a peer connected to our listener
    std::function<void(ConnId, const std::string& why)> on_disconnect;  // error or peer gone; the id is dead
    std::function<void(ConnId, std::span<const uint8_t> header, Incoming& data)> on_message;
    std::function<void()> on_tick;  // about every 50 ms: timeouts
  };
  // Throws std::runtime_error when UCX cannot start (message says why).
  explicit UcxLink(Handlers h);
  ~UcxLink();
  UcxLink(const UcxLink&) = delete;
  UcxLink& operator=(const UcxLink&) = delete;

  // Starts listening; returns the port bound (0 asks for a free one).
  // Throws std::runtime_error naming the address.
  uint16_t listen(const std::string& host, uint16_t port);
  // A new connection (its handshake is the caller's first message). Failure
  // arrives as on_disconnect.
  ConnId connect(const std::string& host, uint16_t port);
  // `done(ok)` on the progress thread when UCX no longer needs the bytes:
  // `header` is copied, `payload` must stay valid until then.
  void send(ConnId c, std::vector<uint8_t> header, std::span<const uint8_t> payload,
            std::function<void(bool ok)> done = {});
  // Progress thread, inside on_message: lands the data in `dst` (exactly
  // data.length bytes); done(ok) when it is there (maybe at once).
  void recv_data(Incoming& data, std::span<uint8_t> dst, std::function<void(bool ok)> done);
  // Drops the connection at once (in-flight operations fail); no
  // on_disconnect for it.
  void close(ConnId c);
  void post(std::function<void()> f);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvs::disagg
