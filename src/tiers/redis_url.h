// Where the Redis tier connects and as whom: parsed from --kv-redis.
//
//   redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]
//
// USER and PASSWORD are percent-decoded (a password holding '@' or ':' is
// written %40, %3A). The password never appears in a message: errors and
// logs show the URL through redis_url_for_logs.
#pragma once
#include <string>

namespace kvs::tiers {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string user;      // empty: the default user (AUTH PASSWORD)
  std::string password;  // empty: no AUTH
  std::string where() const { return host + ":" + std::to_string(port); }
};

// Throws std::invalid_argument saying what is wrong (without the password).
RedisEndpoint parse_redis_url(const std::string& url);

// The URL with any password replaced by ***, for banners and errors.
std::string redis_url_for_logs(const std::string& url);

}  // namespace kvs::tiers
