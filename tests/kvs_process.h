// A kvserve child process (serve, router) for tests over real sockets, and a
// small blocking HTTP/1.1 client for 127.0.0.1. The process's stdout is read
// line by line until a line matches `ready` (its listening line); stderr goes
// to a log file the test can print on failure.
#pragma once
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace kvs::test {

class KvsProcess {
 public:
  // Runs `KVS_BINARY args...`; throws std::runtime_error (with the log) when
  // no stdout line matches the `ready` regex within timeout_s.
  KvsProcess(std::vector<std::string> args, const std::string& ready, double timeout_s = 120);
  ~KvsProcess();  // SIGKILL if still running
  KvsProcess(const KvsProcess&) = delete;
  KvsProcess& operator=(const KvsProcess&) = delete;

  // Stdout lines read so far (up to and including the ready line).
  const std::vector<std::string>& lines() const { return lines_; }
  // The first capture group of `re` in the lines read so far ("" if none).
  std::string find(const std::string& re) const;
  // SIGTERM, then wait; the exit status (-1: killed after the timeout).
  int stop(double timeout_s = 30);
  void kill9();  // SIGKILL and reap
  bool alive() const;
  pid_t pid() const { return pid_; }
  std::string log() const;

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::vector<std::string> lines_;
  std::string log_path_;
};

struct HttpReply {
  int status = 0;                              // 0: no response (refused, reset)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

// One request on a fresh connection (Connection: close). `headers`: extra
// request headers. `stop_after_bytes` > 0: hang up once that much body has
// arrived (a client that leaves mid-stream).
HttpReply http_request(int port, const std::string& method, const std::string& path, const std::string& body = "",
                       const std::map<std::string, std::string>& headers = {}, double timeout_s = 120,
                       size_t stop_after_bytes = 0);

// The value of the Prometheus sample `name_labels` (exact text before the
// value) in /metrics; -1 when absent.
double metric_value(int port, const std::string& name_labels);

// A free TCP port on 127.0.0.1 at the time of the call.
int free_port();

}  // namespace kvs::test
