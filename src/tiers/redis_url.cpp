#include "tiers/redis_url.h"

#include <stdexcept>

namespace kvs::tiers {

static const std::string kScheme = "redis://";

std::string redis_url_for_logs(const std::string& url) {
  const size_t from = url.find("://");
  if (from == std::string::npos) return url;
  const size_t at = url.rfind('@');
  if (at == std::string::npos || at < from) return url;
  const std::string info = url.substr(from + 3, at - from - 3);
  const size_t colon = info.find(':');
  return url.substr(0, from + 3) + (colon == std::string::npos ? info : info.substr(0, colon) + ":***") + url.substr(at);
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// `what` names the part in the error; the text itself is never shown.
static std::string percent_decode(const std::string& s, const char* what) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    const int hi = i + 2 < s.size() ? hex_digit(s[i + 1]) : -1, lo = hi >= 0 ? hex_digit(s[i + 2]) : -1;
    if (lo < 0)
      throw std::invalid_argument(std::string("--kv-redis: the ") + what +
                                  " has a '%' not followed by two hex digits; write a literal % as %25");
    out += char(hi * 16 + lo);
    i += 2;
  }
  return out;
}

// A user without a password is kept: the password may come from
// --kv-redis-password-file (the caller checks that one does).
static void parse_userinfo(const std::string& info, RedisEndpoint& ep) {
  const size_t colon = info.find(':');
  ep.user = percent_decode(info.substr(0, colon), "user name");
  if (colon != std::string::npos) ep.password = percent_decode(info.substr(colon + 1), "password");
}

static void parse_host_port(const std::string& hp, RedisEndpoint& ep) {
  const auto colon = hp.rfind(':');
  ep.host = colon == std::string::npos ? hp : hp.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string port = hp.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      throw std::invalid_argument("--kv-redis: port '" + port + "' is not a port number");
    ep.port = std::stoi(port);
  }
}

RedisEndpoint parse_redis_url(const std::string& url) {
  const std::string shown = redis_url_for_logs(url);
  if (url.rfind("rediss://", 0) == 0 || url.rfind("unix://", 0) == 0)
    throw std::invalid_argument("--kv-redis: " + shown.substr(0, shown.find("://")) +
                                ":// is not supported (no TLS or unix socket connections): use redis://HOST:PORT, "
                                "over a network you trust or through a TLS tunnel such as stunnel");
  if (url.rfind(kScheme, 0) != 0)
    throw std::invalid_argument("--kv-redis: expected redis://HOST:PORT, got '" + shown + "'");
  std::string rest = url.substr(kScheme.size());
  RedisEndpoint ep;
  // The last '@' ends the credentials: a password may hold '@' or '/'.
  if (const auto at = rest.rfind('@'); at != std::string::npos) {
    parse_userinfo(rest.substr(0, at), ep);
    rest.erase(0, at + 1);
  }
  if (const auto slash = rest.find('/'); slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    rest.resize(slash);
    if (!db.empty()) {
      if (db.find_first_not_of("0123456789") != std::string::npos || db.size() > 4)
        throw std::invalid_argument("--kv-redis: database '" + db + "' is not a number");
      ep.db = std::stoi(db);
    }
  }
  parse_host_port(rest, ep);
  if (ep.host.empty()) throw std::invalid_argument("--kv-redis: no host in '" + shown + "'");
  return ep;
}

}  // namespace kvs::tiers
