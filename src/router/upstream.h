// Small blocking HTTP/1.1 client pieces the router uses towards workers
// (Boost.Beast over one TCP connection per request, every step under a
// deadline).
#pragma once
#include <optional>
#include <string>

namespace kvs::router {

struct HostPort {
  std::string host;
  int port = 0;
};

// "http://HOST:PORT" (a trailing slash allowed); throws std::runtime_error.
HostPort parse_http_url(const std::string& url);

struct SimpleReply {
  int status = 0;
  std::string body;
};
// GET `target`; nullopt when the worker could not be reached or answered
// garbage within `timeout_s`. `error` receives why.
std::optional<SimpleReply> http_get(const HostPort& to, const std::string& target, double timeout_s,
                                    std::string* error = nullptr);

}  // namespace kvs::router
