// A `kvserve serve` child process on a free 127.0.0.1 port and a small
// blocking HTTP/1.1 client for tests that drive it over real sockets.
//
// The child is the KVS_BINARY of the build, so a sanitizer build tests its
// own sanitized server: a report inside the server makes it exit non-zero
// (TSAN_OPTIONS exitcode, ASan/UBSan abort, LSan at exit), which stop()
// returns and prints together with the server's log.
#pragma once
#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvs::test {

class ServeProcess {
 public:
  // Starts `kvserve serve --port 0 <args>` and waits (bounded) for its ready
  // line; throws std::runtime_error with the log when it does not come.
  explicit ServeProcess(const std::vector<std::string>& args);
  ~ServeProcess();  // stop() if still running
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // SIGTERM, then waits up to timeout_s. The exit status (128 + signal when
  // killed by one, -1 when it had to be SIGKILLed). A non-zero status
  // prints the server's log on stderr (the sanitizer report is in it).
  int stop(double timeout_s = 60);
  int port() const { return port_; }
  std::string log() const;

 private:
  pid_t pid_ = -1;
  int port_ = 0, stdout_fd_ = -1, status_ = 0;
  std::string log_path_;
};

struct HttpReply {
  int status = 0;                              // 0: no (complete) response head
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  bool complete = false;                       // the whole body arrived
};

// What a streamed request sees chunk by chunk; return false to hang up
// (the connection is closed at once, mid-stream).
using ChunkFn = std::function<bool(const std::string& chunk)>;

// One request on a fresh connection ("Connection: close"). `key`: bearer
// token. Reads are bounded by recv_timeout_s per recv.
HttpReply http_request(int port, const std::string& method, const std::string& path, const std::string& body = "",
                       const std::string& key = "", const ChunkFn& on_chunk = nullptr, double recv_timeout_s = 60);

// The value of an unlabelled (or fully labelled) sample in Prometheus text,
// or -1 when absent.
double metric_value(const std::string& metrics_text, const std::string& name);

// "data: ..." payloads of an SSE body, in order ("[DONE]" included as is).
std::vector<std::string> sse_payloads(const std::string& body);

// Lowercase hex SHA-256 (key hashes for --api-keys files).
std::string sha256_hex(const std::string& s);

double monotonic_s();

}  // namespace kvs::test
