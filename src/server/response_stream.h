// What an HTTP session writes while a response is produced over time: a
// completion's SSE stream (Exchange) or the dashboard's event stream. The
// session polls it on its own strand after each wake-up and writes what
// comes back; it never touches a socket itself.
#pragma once
#include <optional>
#include <string>

#include "server/http_response.h"

namespace kvs::server {

struct StreamOutput {
  std::optional<HttpResponse> full;  // a whole response (non-streaming result, or an error before streaming)
  bool start_stream = false;         // send the SSE response head now (first time only)
  std::string data;                  // SSE bytes to send (after the head)
  bool done = false;                 // nothing more will come
  bool cut_off = false;              // the client could not keep up: close the connection
};

class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  // On the session's strand, after a wake-up: what to write now.
  virtual StreamOutput poll() = 0;
  // The client went away (read EOF/reset or write failure).
  virtual void client_gone() = 0;
};

}  // namespace kvs::server
