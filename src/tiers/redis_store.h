// The Redis tier's storage: entries as string values on a redis-server that
// several replicas share, so one replica's computed prefix is another's hit.
//
//   kvs:b:<id>       the sealed entry, with a TTL equal to its retention
//   kvs:s:<scope fp> set of the scope's entry ids (revoke deletes them all)
//
// Connection: hiredis, synchronous, with a connect and a command timeout, on
// the tier worker thread only. Every connection sends AUTH (when the URL or
// the password file gives a password) and SELECT, then PING. Any error or
// timeout marks the store unavailable (one log line, available() false):
// operations fail fast, the server serves without the tier, and it
// reconnects with exponential backoff (one more log line when it is back).
// A value of another type under a tier key is a bad entry, not an outage.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "tiers/blob_store.h"
#include "tiers/redis_url.h"

struct redisContext;
struct redisReply;

namespace kvs::tiers {

struct RedisOptions {
  double connect_timeout_s = 0.5;
  double command_timeout_s = 0.5;
  double backoff_min_s = 0.25, backoff_max_s = 10.0;
  // The longest TTL a key of the tier may keep (0: no cap): applied to the
  // keys already there at the first connection, so a retention shortened
  // since they were written holds for them too.
  double max_ttl_s = 0;
  // Where the password comes from again (--kv-redis-password-file), read
  // before each reconnect's AUTH: a password rotated on the server and in
  // the file takes effect without a restart. Null: the endpoint's, always.
  // A read that throws keeps the last password (said once).
  std::function<std::string()> password_source;
};

class RedisStore final : public BlobStore {
 public:
  using Log = std::function<void(const std::string&)>;
  // Connects at once; an unreachable server is not an error (the store
  // starts unavailable and keeps trying).
  RedisStore(RedisEndpoint ep, RedisOptions opts = {}, Log log = {});
  ~RedisStore() override;

  const char* name() const override { return "redis"; }
  PutStatus put(const std::string& id, std::span<const uint8_t> blob, const BlobMeta& meta) override;
  GetStatus get(const std::string& id, std::vector<uint8_t>& out) override;
  void erase(const std::string& id) override;
  int64_t erase_scope(const ScopeFp& scope) override;
  // Redis expires entries itself; this refreshes bytes() from INFO memory:
  // the server's used_memory, all its keys (other replicas' entries too).
  int64_t sweep_expired(int64_t now_unix) override;
  int64_t bytes() const override { return bytes_.load(std::memory_order_relaxed); }
  int64_t evictions() const override { return 0; }
  bool available() const override { return up_.load(std::memory_order_relaxed); }
  // Why the server refused the last connection's AUTH, SELECT or PING, with
  // the fix ("" when it did not): a start-up error, as it will not heal.
  const std::string& refused() const { return refused_; }

 private:
  bool ensure();  // connected, or false (still in backoff, or the retry failed)
  bool handshake();
  void reload_password();
  bool handshake_step(redisReply* r, const char* step);
  void cap_ttls();
  void refresh_bytes();
  void failed(const std::string& what);
  std::string scrub(std::string text) const;  // the password, should a reply echo it, as ***
  redisReply* command(const char* fmt, ...);

  RedisEndpoint ep_;
  RedisOptions opts_;
  Log log_;
  redisContext* ctx_ = nullptr;
  std::chrono::steady_clock::time_point retry_at_{};
  double backoff_s_ = 0;
  bool ever_up_ = false;
  bool capped_ = false;
  bool starting_ = false;  // in the constructor: a refusal is the caller's start-up error, not a log line
  std::string refused_;
  bool reload_failed_ = false;  // the last password_source read threw (said once)
  std::atomic<bool> up_{false};
  std::atomic<int64_t> bytes_{0};
};

}  // namespace kvs::tiers
