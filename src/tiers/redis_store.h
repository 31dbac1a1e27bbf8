// The Redis tier's storage: entries as string values on a redis-server that
// several replicas share, so one replica's computed prefix is another's hit.
//
//   kvs:b:<id>       the sealed entry, with a TTL equal to its retention
//   kvs:s:<scope fp> set of the scope's entry ids (revoke deletes them all)
//
// Connection: hiredis, synchronous, with a connect and a command timeout, on
// the tier worker thread only. Any error or timeout marks the store
// unavailable (one log line, available() false): operations fail fast, the
// server serves without the tier, and it reconnects with exponential backoff
// (one more log line when it is back).
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "tiers/blob_store.h"

struct redisContext;
struct redisReply;

namespace kvs::tiers {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int db = 0;
};
// Parses redis://HOST[:PORT][/DB]; throws std::invalid_argument saying what is wrong.
RedisEndpoint parse_redis_url(const std::string& url);

struct RedisOptions {
  double connect_timeout_s = 0.5;
  double command_timeout_s = 0.5;
  double backoff_min_s = 0.25, backoff_max_s = 10.0;
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
  // Redis expires entries itself; this refreshes bytes() from INFO memory.
  int64_t sweep_expired(int64_t now_unix) override;
  int64_t bytes() const override { return bytes_.load(std::memory_order_relaxed); }
  int64_t evictions() const override { return 0; }
  bool available() const override { return up_.load(std::memory_order_relaxed); }

 private:
  bool ensure();  // connected, or false (still in backoff, or the retry failed)
  void failed(const char* what);
  redisReply* command(const char* fmt, ...);

  RedisEndpoint ep_;
  RedisOptions opts_;
  Log log_;
  redisContext* ctx_ = nullptr;
  std::chrono::steady_clock::time_point retry_at_{};
  double backoff_s_ = 0;
  bool ever_up_ = false;
  std::atomic<bool> up_{false};
  std::atomic<int64_t> bytes_{0};
};

}  // namespace kvs::tiers
