#include "http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "sched/clock.h"

namespace kvs::test {

namespace {

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
bool read_chunked(Reader& rd, HttpReply& r, size_t stop_after_bytes, const ChunkFn& on_chunk) {
  for (;;) {
    const size_t le = rd.until("\r\n");
    if (le == std::string::npos) return false;
    const size_t len = std::stoul(rd.buf.substr(0, le), nullptr, 16);
    if (!rd.have(le + 2 + len + 2)) return false;
    if (len == 0) return true;
    const std::string piece = rd.buf.substr(le + 2, len);
    rd.buf.erase(0, le + 2 + len + 2);
    r.body += piece;
    r.chunk_times.push_back(sched::steady_now());
    if (on_chunk && !on_chunk(piece)) return false;
    if (stop_after_bytes > 0 && r.body.size() >= stop_after_bytes) return false;
  }
}

// A body delimited by its length, or (len == npos) by the connection's close.
bool read_plain(Reader& rd, HttpReply& r, size_t len, size_t stop_after_bytes) {
  const bool to_close = len == std::string::npos;
  const size_t want = stop_after_bytes > 0 ? std::min(len, stop_after_bytes) : len;
  if (want == std::string::npos) {
    while (rd.fill()) {
    }
  } else {
    rd.have(want);
  }
  r.body = rd.buf.substr(0, std::min(rd.buf.size(), len));
  return to_close ? stop_after_bytes == 0 : r.body.size() == len;
}

}  // namespace

HttpReply http_request(int port, const std::string& method, const std::string& path, const std::string& body,
                       const std::map<std::string, std::string>& headers, double timeout_s, size_t stop_after_bytes,
                       const ChunkFn& on_chunk) {
  HttpReply r;
  const int fd = connect_local(port, timeout_s);
  if (fd < 0) return r;
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  req += "\r\n" + body;
  Reader rd{fd, {}};
  // A server may answer before it has read everything (413 on a body over
  // its limit) and close: its answer is still read.
  send_all(fd, req);
  const size_t he = rd.until("\r\n\r\n");
  if (he != std::string::npos && parse_head(rd.buf.substr(0, he), r)) {
    rd.buf.erase(0, he + 4);
    if (r.headers.count("content-length"))
      r.complete = read_plain(rd, r, std::stoul(r.headers["content-length"]), stop_after_bytes);
    else if (r.headers["transfer-encoding"] == "chunked")
      r.complete = read_chunked(rd, r, stop_after_bytes, on_chunk);
    else
      r.complete = read_plain(rd, r, std::string::npos, stop_after_bytes);
  }
  close(fd);
  return r;
}

std::map<std::string, std::string> bearer(const std::string& key) {
  if (key.empty()) return {};
  return {{"Authorization", "Bearer " + key}};
}

double metric_value(const std::string& metrics_text, const std::string& name_labels) {
  std::istringstream is(metrics_text);
  std::string line;
  while (std::getline(is, line))
    if (line.size() > name_labels.size() && line.compare(0, name_labels.size(), name_labels) == 0 &&
        line[name_labels.size()] == ' ')
      return std::stod(line.substr(name_labels.size() + 1));
  return -1;
}

double metric_value(int port, const std::string& name_labels) {
  return metric_value(http_request(port, "GET", "/metrics").body, name_labels);
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

bool send_all(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

}  // namespace kvs::test
