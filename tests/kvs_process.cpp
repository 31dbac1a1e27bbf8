#include "kvs_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "test_util.h"

namespace kvs::test {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

KvsProcess::KvsProcess(std::vector<std::string> args, const std::string& ready, double timeout_s) {
  static int counter = 0;
  log_path_ = temp_dir() + "/kvs-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".log";
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe");
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out[1], 1);
    const int err = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(err, 2);
    close(out[0]);
    std::vector<std::string> full = {KVS_BINARY};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : full) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  out_fd_ = out[0];
  const std::regex re(ready);
  std::string line;
  const double t0 = now_s();
  while (now_s() - t0 < timeout_s) {
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char c;
    if (read(out_fd_, &c, 1) != 1) break;
    if (c != '\n') {
      line += c;
      continue;
    }
    lines_.push_back(line);
    line.clear();
    if (std::regex_search(lines_.back(), re)) return;
  }
  kill9();
  throw std::runtime_error("kvserve did not print /" + ready + "/; log:\n" + log());
}

KvsProcess::~KvsProcess() {
  kill9();
  if (out_fd_ >= 0) close(out_fd_);
}

std::string KvsProcess::find(const std::string& re) const {
  const std::regex r(re);
  for (const auto& l : lines_) {
    std::smatch m;
    if (std::regex_search(l, m, r) && m.size() > 1) return m[1];
  }
  return "";
}

int KvsProcess::stop(double timeout_s) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const double t0 = now_s();
  int st = 0;
  while (now_s() - t0 < timeout_s) {
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill9();
  return -1;
}

void KvsProcess::kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

bool KvsProcess::alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

std::string KvsProcess::log() const {
  try {
    return read_file(log_path_);
  } catch (const std::exception&) {
    return "";
  }
}

HttpReply http_request(int port, const std::string& method, const std::string& path, const std::string& body,
                       const std::map<std::string, std::string>& headers, double timeout_s, size_t stop_after_bytes) {
  HttpReply r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return r;
  }
  timeval tv{time_t(timeout_s), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  req += "\r\n" + body;
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != ssize_t(req.size())) {
    close(fd);
    return r;
  }
  std::string buf;
  char tmp[16384];
  ssize_t n;
  while ((n = recv(fd, tmp, sizeof tmp, 0)) > 0) {
    buf.append(tmp, size_t(n));
    const size_t head = buf.find("\r\n\r\n");
    if (stop_after_bytes > 0 && head != std::string::npos && buf.size() - head - 4 >= stop_after_bytes) break;
  }
  close(fd);
  const size_t he = buf.find("\r\n\r\n");
  if (buf.size() < 12 || he == std::string::npos) return r;
  r.status = std::stoi(buf.substr(9, 3));
  std::istringstream hs(buf.substr(0, he));
  std::string line;
  std::getline(hs, line);
  while (std::getline(hs, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t c = line.find(':');
    if (c == std::string::npos) continue;
    std::string k = line.substr(0, c), v = line.substr(c + 1);
    for (auto& ch : k) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    while (!v.empty() && v[0] == ' ') v.erase(0, 1);
    r.headers[k] = v;
  }
  std::string rest = buf.substr(he + 4);
  if (r.headers["transfer-encoding"] != "chunked") {
    r.body = rest;
    return r;
  }
  for (size_t p = 0;;) {
    const size_t le = rest.find("\r\n", p);
    if (le == std::string::npos) break;
    const size_t len = std::stoul(rest.substr(p, le - p), nullptr, 16);
    if (len == 0 || le + 2 + len > rest.size()) {
      if (len != 0) r.body += rest.substr(le + 2);
      break;
    }
    r.body += rest.substr(le + 2, len);
    p = le + 2 + len + 2;
  }
  return r;
}

double metric_value(int port, const std::string& name_labels) {
  const HttpReply r = http_request(port, "GET", "/metrics");
  std::istringstream is(r.body);
  std::string line;
  while (std::getline(is, line))
    if (line.rfind(name_labels + " ", 0) == 0) return std::stod(line.substr(name_labels.size() + 1));
  return -1;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    throw std::runtime_error("free_port: bind failed");
  }
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace kvs::test
