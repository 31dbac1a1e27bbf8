#include "server/http_response.h"

#include <ostream>  // Boost.Beast 1.74 headers use std::ostream without including it
#include <boost/beast/http/status.hpp>

namespace kvs::server {

namespace http = boost::beast::http;

std::string status_line(int status) {
  const auto reason = http::obsolete_reason(http::int_to_status(unsigned(status)));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.data(), reason.size()) + "\r\n";
}

std::string full_response(const HttpResponse& r, std::string_view server, bool keep_alive) {
  std::string s = status_line(r.status);
  s += "Server: " + std::string(server) + "\r\nContent-Type: " + r.content_type + "\r\n";
  for (const auto& [k, v] : r.headers) s += k + ": " + v + "\r\n";
  s += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  s += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return s + r.body;
}

std::string stream_head(int status, std::string_view server, std::string_view content_type, bool chunked,
                        bool keep_alive) {
  std::string s = status_line(status);
  s += "Server: " + std::string(server) + "\r\nContent-Type: " + std::string(content_type) +
       "\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
  if (chunked) s += "Transfer-Encoding: chunked\r\n";
  s += chunked && keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return s;
}

}  // namespace kvs::server
