// ZeroMQ CURVE keys for the KV-event channel (`--kv-events-curve KEYFILE`
// on `kvserve serve` and on `kvserve router`). One file format for both
// ends: a ZeroMQ certificate as zmq's zcert tools write it, with two more
// kinds of line:
//
//   curve
//       public-key = "<40 Z85 characters>"    this end's own key pair
//       secret-key = "<40 Z85 characters>"
//       server-key = "<40 Z85 characters>"    router: the workers' public key
//       client-key = "<40 Z85 characters>"    worker, repeatable: a router let in
//
// A worker needs its own pair. With client-key lines, only subscribers
// whose public key is listed complete the handshake (the publisher answers
// ZeroMQ's ZAP requests); without them any subscriber that knows the
// worker's public key may subscribe (encrypted, not authenticated). A
// router needs its own pair and server-key. Other lines (section names,
// `#` comments, zcert metadata) are ignored.
#pragma once
#include <string>
#include <vector>

namespace kvs::events {

enum class CurveEnd { Worker, Subscriber };

struct CurveKeys {
  std::string public_key;                // Z85, 40 characters: this end's pair
  std::string secret_key;
  std::string server_key;                // subscriber: the worker's public key
  std::vector<std::string> client_keys;  // worker: subscribers let in (empty: any)
};

// Throws std::runtime_error naming the file and what is missing or wrong
// (a key that is not Z85, a public key that does not belong to the secret
// key, a line the end needs).
CurveKeys read_curve_keyfile(const std::string& path, CurveEnd end);
// The same from the file's text.
CurveKeys parse_curve_keys(const std::string& text, const std::string& source, CurveEnd end);

}  // namespace kvs::events
