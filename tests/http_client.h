// A small blocking HTTP/1.1 client for tests that drive kvserve over real
// sockets on 127.0.0.1, and the pieces of it that raw-socket tests use.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvs::test {

struct HttpReply {
  int status = 0;                              // 0: no (complete) response head: refused, reset
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  bool complete = false;                       // the whole body arrived
  std::vector<double> chunk_times;             // when each HTTP chunk arrived (sched::steady_now)
};

// What a streamed (chunked) request sees chunk by chunk; return false to
// hang up at once, mid-stream.
using ChunkFn = std::function<bool(const std::string& chunk)>;

// One request on a fresh connection (Connection: close). `headers`: extra
// request headers (bearer() makes an Authorization one). Each recv waits at
// most `timeout_s`. `stop_after_bytes` > 0: hang up once that much body has
// arrived (a client that leaves mid-stream).
HttpReply http_request(int port, const std::string& method, const std::string& path, const std::string& body = "",
                       const std::map<std::string, std::string>& headers = {}, double timeout_s = 120,
                       size_t stop_after_bytes = 0, const ChunkFn& on_chunk = nullptr);
// {"Authorization": "Bearer <key>"}, or no header for an empty key.
std::map<std::string, std::string> bearer(const std::string& key);

// The value of the Prometheus sample `name_labels` (the exact text before
// the value) in `metrics_text`, or in the /metrics of the server on `port`;
// -1 when absent.
double metric_value(const std::string& metrics_text, const std::string& name_labels);
double metric_value(int port, const std::string& name_labels);

// "data: ..." payloads of an SSE body, in order ("[DONE]" included as is).
std::vector<std::string> sse_payloads(const std::string& body);

// A free TCP port on 127.0.0.1 at the time of the call.
int free_port();
// A connection to 127.0.0.1:port whose reads wait at most recv_timeout_s;
// -1 when refused.
int connect_local(int port, double recv_timeout_s = 120);
bool send_all(int fd, const std::string& bytes);

}  // namespace kvs::test
