// ZeroMQ's authentication hook (ZAP, ZeroMQ RFC 27) for the KV-event
// publisher: a REP socket on inproc://zeromq.zap.01 in the publisher's
// context. libzmq asks it during every CURVE handshake on a socket of that
// context, and it lets in only the listed client public keys (the worker
// key file's client-key lines). Without a handler bound, libzmq lets every
// CURVE client in, so it is bound only when keys are listed.
//
// The publisher thread polls socket() and calls answer(); a handshake waits
// for the answer, never the engine.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>
#include <zmq.hpp>

namespace kvs::events {

class ZapHandler {
 public:
  // Binds the hook (throws std::runtime_error when the context has one).
  // `z85_keys`: the client public keys let in.
  ZapHandler(zmq::context_t& ctx, const std::vector<std::string>& z85_keys);

  zmq::socket_t& socket() { return sock_; }
  // Answers one pending request without waiting; false when it refused a
  // client. The first refusal of each key is logged with the key's start.
  bool answer();
  int64_t refused() const { return refused_; }

 private:
  zmq::socket_t sock_;
  std::set<std::string> allowed_;  // raw 32-byte keys
  std::set<std::string> logged_;   // refused keys already logged (bounded)
  int64_t refused_ = 0;
};

}  // namespace kvs::events
