#include "tiers/redis_store.h"
#include "tiers/sealed_block.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstdarg>
#include <stdexcept>

namespace kvs::tiers {

RedisEndpoint parse_redis_url(const std::string& url) {
  const std::string scheme = "redis://";
  if (url.rfind(scheme, 0) != 0)
    throw std::invalid_argument("--kv-redis: expected redis://HOST:PORT, got '" + url + "'");
  std::string rest = url.substr(scheme.size());
  RedisEndpoint ep;
  if (const auto slash = rest.find('/'); slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    rest.resize(slash);
    if (!db.empty()) {
      if (db.find_first_not_of("0123456789") != std::string::npos || db.size() > 4)
        throw std::invalid_argument("--kv-redis: database '" + db + "' is not a number");
      ep.db = std::stoi(db);
    }
  }
  if (rest.find('@') != std::string::npos)
    throw std::invalid_argument("--kv-redis: credentials in the URL are not supported");
  const auto colon = rest.rfind(':');
  ep.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      throw std::invalid_argument("--kv-redis: port '" + port + "' is not a port number");
    ep.port = std::stoi(port);
  }
  if (ep.host.empty()) throw std::invalid_argument("--kv-redis: no host in '" + url + "'");
  return ep;
}

static timeval to_timeval(double s) {
  timeval tv;
  tv.tv_sec = long(s);
  tv.tv_usec = long((s - double(tv.tv_sec)) * 1e6);
  return tv;
}

RedisStore::RedisStore(RedisEndpoint ep, RedisOptions opts, Log log)
    : ep_(std::move(ep)), opts_(opts), log_(std::move(log)) {
  ensure();
}

RedisStore::~RedisStore() {
  if (ctx_) redisFree(ctx_);
}

void RedisStore::failed(const char* what) {
  const std::string why = ctx_ && ctx_->err ? ctx_->errstr : what;
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
  backoff_s_ = std::clamp(backoff_s_ * 2, opts_.backoff_min_s, opts_.backoff_max_s);
  retry_at_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                      std::chrono::duration<double>(backoff_s_));
  if (up_.exchange(false) || !ever_up_) {
    if (log_)
      log_("kv tier redis: unavailable (" + ep_.host + ":" + std::to_string(ep_.port) + ": " + why +
           "); serving without it, reconnecting with backoff");
    ever_up_ = true;  // one line for a server that was never reachable, too
  }
}

bool RedisStore::ensure() {
  if (ctx_) return true;
  if (std::chrono::steady_clock::now() < retry_at_) return false;
  ctx_ = redisConnectWithTimeout(ep_.host.c_str(), ep_.port, to_timeval(opts_.connect_timeout_s));
  if (!ctx_ || ctx_->err) {
    failed("cannot connect");
    return false;
  }
  redisSetTimeout(ctx_, to_timeval(opts_.command_timeout_s));
  if (ep_.db != 0) {
    redisReply* r = static_cast<redisReply*>(redisCommand(ctx_, "SELECT %d", ep_.db));
    const bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r) freeReplyObject(r);
    if (!ok) {
      failed("SELECT failed");
      return false;
    }
  }
  backoff_s_ = 0;
  if (!up_.exchange(true) && log_) log_("kv tier redis: connected to " + ep_.host + ":" + std::to_string(ep_.port));
  ever_up_ = true;
  return true;
}

redisReply* RedisStore::command(const char* fmt, ...) {
  if (!ensure()) return nullptr;
  va_list ap;
  va_start(ap, fmt);
  auto* r = static_cast<redisReply*>(redisvCommand(ctx_, fmt, ap));
  va_end(ap);
  if (!r || r->type == REDIS_REPLY_ERROR) {
    // The server's own words (NOAUTH, WRONGTYPE, OOM ...) say what to fix.
    const std::string why = r && r->str ? "the server answered: " + std::string(r->str, r->len) : "command failed";
    if (r) freeReplyObject(r);
    failed(why.c_str());
    return nullptr;
  }
  return r;
}

PutStatus RedisStore::put(const std::string& id, std::span<const uint8_t> blob, const BlobMeta& meta) {
  const long long ttl = std::max<long long>(1, meta.expires_unix - static_cast<long long>(time(nullptr)));
  const std::string key = "kvs:b:" + id, set = "kvs:s:" + hex(meta.scope);
  redisReply* r = command("SET %b %b EX %lld NX", key.data(), key.size(), blob.data(), blob.size(), ttl);
  if (!r) return PutStatus::Failed;
  const bool stored = r->type == REDIS_REPLY_STATUS;
  freeReplyObject(r);
  if (!stored) return PutStatus::Exists;
  r = command("SADD %b %b", set.data(), set.size(), id.data(), id.size());
  if (!r) return PutStatus::Failed;
  freeReplyObject(r);
  r = command("EXPIRE %b %lld GT", set.data(), set.size(), ttl);
  if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 0) {  // no TTL yet: GT never sets a first one
    freeReplyObject(r);
    r = command("EXPIRE %b %lld NX", set.data(), set.size(), ttl);
  }
  if (r) freeReplyObject(r);
  return PutStatus::Stored;
}

GetStatus RedisStore::get(const std::string& id, std::vector<uint8_t>& out) {
  const std::string key = "kvs:b:" + id;
  redisReply* r = command("GET %b", key.data(), key.size());
  if (!r) return GetStatus::Failed;
  GetStatus st = GetStatus::Miss;
  if (r->type == REDIS_REPLY_STRING) {
    out.assign(reinterpret_cast<const uint8_t*>(r->str), reinterpret_cast<const uint8_t*>(r->str) + r->len);
    st = GetStatus::Hit;
  }
  freeReplyObject(r);
  return st;
}

void RedisStore::erase(const std::string& id) {
  const std::string key = "kvs:b:" + id;
  if (redisReply* r = command("DEL %b", key.data(), key.size())) freeReplyObject(r);
}

int64_t RedisStore::erase_scope(const ScopeFp& scope) {
  const std::string set = "kvs:s:" + hex(scope);
  redisReply* r = command("SMEMBERS %b", set.data(), set.size());
  if (!r) return 0;
  int64_t n = 0;
  if (r->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < r->elements; ++i) {
      const std::string key = "kvs:b:" + std::string(r->element[i]->str, r->element[i]->len);
      if (redisReply* d = command("DEL %b", key.data(), key.size())) {
        n += d->type == REDIS_REPLY_INTEGER ? d->integer : 0;
        freeReplyObject(d);
      }
    }
  }
  freeReplyObject(r);
  if (redisReply* d = command("DEL %b", set.data(), set.size())) freeReplyObject(d);
  return n;
}

int64_t RedisStore::sweep_expired(int64_t) {
  redisReply* r = command("INFO memory");
  if (!r) return 0;
  if (r->type == REDIS_REPLY_STRING) {
    const std::string info(r->str, r->len);
    const auto at = info.find("used_memory:");
    if (at != std::string::npos) bytes_ = std::stoll(info.substr(at + 12));
  }
  freeReplyObject(r);
  return 0;
}

}  // namespace kvs::tiers
