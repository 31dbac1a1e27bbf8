#include "server_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/sha.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "test_util.h"

namespace kvs::test {

double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

int exit_status(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

// Reads the child's stdout until the ready line names the port (0: none
// within the limit, or the child ended).
int wait_for_port(int fd, double limit_s) {
  static const std::regex ready("listening on http://[0-9.]+:([0-9]+)");
  std::string line;
  const double t0 = monotonic_s();
  while (monotonic_s() - t0 < limit_s) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char c;
    if (read(fd, &c, 1) != 1) return 0;
    if (c != '\n') {
      line += c;
      continue;
    }
    std::smatch m;
    if (std::regex_search(line, m, ready)) return std::stoi(m[1]);
    line.clear();
  }
  return 0;
}

}  // namespace

ServeProcess::ServeProcess(const std::vector<std::string>& args) {
  static int counter = 0;
  log_path_ = temp_dir() + "/serve-harness-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".log";
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> full = {KVS_BINARY, "serve", "--host", "127.0.0.1", "--port", "0"};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : full) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    dup2(out[1], 1);
    const int err = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) dup2(err, 2);
    close(out[0]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  stdout_fd_ = out[0];
  port_ = wait_for_port(stdout_fd_, 120);
  if (port_ == 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    close(stdout_fd_);
    stdout_fd_ = -1;
    throw std::runtime_error("kvserve serve did not start; log:\n" + log());
  }
}

ServeProcess::~ServeProcess() {
  if (pid_ > 0) stop();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

std::string ServeProcess::log() const { return read_file(log_path_); }

int ServeProcess::stop(double timeout_s) {
  if (pid_ <= 0) return status_;
  kill(pid_, SIGTERM);
  int st = 0;
  const double t0 = monotonic_s();
  status_ = -1;
  while (monotonic_s() - t0 < timeout_s) {
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = exit_status(st);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (status_ == -1) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &st, 0);
  }
  pid_ = -1;
  if (status_ != 0) std::fprintf(stderr, "kvserve serve exited with status %d; its log:\n%s\n", status_, log().c_str());
  return status_;
}

namespace {

int connect_local(int port, double recv_timeout_s) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{};
  tv.tv_sec = time_t(recv_timeout_s);
  tv.tv_usec = suseconds_t((recv_timeout_s - double(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// Buffered reads of one connection.
struct Reader {
  int fd;
  std::string buf;
  bool fill() {
    char tmp[16384];
    const ssize_t n = recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, size_t(n));
    return true;
  }
  // Until `delim` is buffered; its position, or npos on EOF/timeout.
  size_t until(const char* delim) {
    size_t p;
    while ((p = buf.find(delim)) == std::string::npos)
      if (!fill()) return std::string::npos;
    return p;
  }
  bool have(size_t n) {
    while (buf.size() < n)
      if (!fill()) return false;
    return true;
  }
};

bool parse_head(const std::string& head, HttpReply& r) {
  std::istringstream hs(head);
  std::string line;
  std::getline(hs, line);
  if (line.size() < 12 || line.compare(0, 5, "HTTP/") != 0) return false;
  r.status = std::stoi(line.substr(9, 3));
  while (std::getline(hs, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t c = line.find(':');
    if (c == std::string::npos) continue;
    std::string k = line.substr(0, c), v = line.substr(c + 1);
    for (auto& ch : k) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    while (!v.empty() && v[0] == ' ') v.erase(0, 1);
    r.headers[k] = v;
  }
  return true;
}

// The chunked body; false when the client hung up or the stream broke.
bool read_chunked(Reader& rd, HttpReply& r, const ChunkFn& on_chunk) {
  for (;;) {
    const size_t le = rd.until("\r\n");
    if (le == std::string::npos) return false;
    const size_t len = std::stoul(rd.buf.substr(0, le), nullptr, 16);
    if (!rd.have(le + 2 + len + 2)) return false;
    if (len == 0) return true;
    const std::string piece = rd.buf.substr(le + 2, len);
    rd.buf.erase(0, le + 2 + len + 2);
    r.body += piece;
    if (on_chunk && !on_chunk(piece)) return false;
  }
}

}  // namespace

HttpReply http_request(int port, const std::string& method, const std::string& path, const std::string& body,
                       const std::string& key, const ChunkFn& on_chunk, double recv_timeout_s) {
  HttpReply r;
  const int fd = connect_local(port, recv_timeout_s);
  if (fd < 0) return r;
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  if (!key.empty()) req += "Authorization: Bearer " + key + "\r\n";
  req += "\r\n" + body;
  Reader rd{fd, {}};
  const size_t he = send_all(fd, req) ? rd.until("\r\n\r\n") : std::string::npos;
  if (he != std::string::npos && parse_head(rd.buf.substr(0, he), r)) {
    rd.buf.erase(0, he + 4);
    if (r.headers.count("content-length")) {
      const size_t len = std::stoul(r.headers["content-length"]);
      r.complete = rd.have(len);
      r.body = rd.buf.substr(0, len);
    } else if (r.headers["transfer-encoding"] == "chunked") {
      r.complete = read_chunked(rd, r, on_chunk);
    } else {
      while (rd.fill()) {
      }
      r.body = rd.buf;
      r.complete = true;
    }
  }
  close(fd);
  return r;
}

double metric_value(const std::string& metrics_text, const std::string& name) {
  std::istringstream is(metrics_text);
  std::string line;
  while (std::getline(is, line))
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 && line[name.size()] == ' ')
      return std::stod(line.substr(name.size() + 1));
  return -1;
}

std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> v;
  size_t p = 0;
  for (;;) {
    const size_t e = body.find("\n\n", p);
    if (e == std::string::npos) break;
    const std::string ev = body.substr(p, e - p);
    p = e + 2;
    if (ev.rfind("data: ", 0) == 0) v.push_back(ev.substr(6));
  }
  return v;
}

std::string sha256_hex(const std::string& s) {
  unsigned char h[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), h);
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char b : h) {
    out += d[b >> 4];
    out += d[b & 15];
  }
  return out;
}

}  // namespace kvs::test
