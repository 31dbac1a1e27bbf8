// A kvserve child process (serve, router) for tests over real sockets. Its
// stdout is read line by line until a line matches `ready` (its listening
// line, or a later feature line); stderr goes to a log file the test can
// print on failure.
//
// The child is the KVS_BINARY of the build, so a sanitizer build tests its
// own sanitized server: a report inside it makes it exit non-zero (TSan's
// exitcode, ASan/UBSan abort, LSan at exit), which stop() returns and
// prints together with the log.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace kvs::test {

class KvsProcess {
 public:
  // Runs `KVS_BINARY args...`; throws std::runtime_error (with the log) when
  // no stdout line matches the `ready` regex within timeout_s, or the child
  // ends first.
  KvsProcess(std::vector<std::string> args, const std::string& ready, double timeout_s = 120);
  virtual ~KvsProcess();  // SIGKILL if still running
  KvsProcess(const KvsProcess&) = delete;
  KvsProcess& operator=(const KvsProcess&) = delete;

  // Stdout lines read so far (up to and including the ready line).
  const std::vector<std::string>& lines() const { return lines_; }
  const std::string& ready_line() const { return lines_.back(); }
  // The first capture group of `re` in the lines read so far ("" if none).
  std::string find(const std::string& re) const;
  // The port of its "listening on http://HOST:PORT" line (0: none yet).
  int port() const;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()); }
  // SIGTERM, then wait; the exit status (128 + signal when a signal ended
  // it, -1 when it had to be SIGKILLed after the timeout); once stopped,
  // the same status again. A non-zero status prints the log on stderr.
  int stop(double timeout_s = 30);
  void kill9();  // SIGKILL and reap
  bool alive() const;
  pid_t pid() const { return pid_; }
  std::string log() const;

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1, status_ = -1;
  std::vector<std::string> lines_;
  std::string log_path_;
};

// `kvserve serve --host 127.0.0.1 --port 0 <args>`, ready once it listens.
// Going out of scope stops it with SIGTERM and expects exit status 0 (a
// sanitizer report or an unclean drain fails the test).
class ServeProcess : public KvsProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& args);
  ~ServeProcess() override;
};

}  // namespace kvs::test
