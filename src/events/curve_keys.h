// ZeroMQ CURVE keys for the KV-event channel (--kv-events-curve KEYFILE).
// The file is a ZeroMQ certificate as zmq's zcert tools write it:
//
//   curve
//       public-key = "<40 Z85 characters>"
//       secret-key = "<40 Z85 characters>"
//
// The worker (server side) needs both; a subscriber needs the public key
// only (it makes its own key pair per connection), so the secret line may be
// left out of the copy handed to routers.
#pragma once
#include <string>

namespace kvs::events {

struct CurveKeys {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters; empty in a public-only file
};

// Throws std::runtime_error naming the file and what is missing.
CurveKeys read_curve_keyfile(const std::string& path);
// The same from the file's text.
CurveKeys parse_curve_keys(const std::string& text, const std::string& source);

}  // namespace kvs::events
