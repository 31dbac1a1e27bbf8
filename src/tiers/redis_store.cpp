#include "tiers/redis_store.h"
#include "tiers/sealed_block.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstdarg>
#include <stdexcept>
#include <string_view>

namespace kvs::tiers {

static constexpr int kScanBatch = 512;  // keys per SCAN step, and PEXPIREs per pipeline

static timeval to_timeval(double s) {
  timeval tv;
  tv.tv_sec = long(s);
  tv.tv_usec = long((s - double(tv.tv_sec)) * 1e6);
  return tv;
}

RedisStore::RedisStore(RedisEndpoint ep, RedisOptions opts, Log log)
    : ep_(std::move(ep)), opts_(opts), log_(std::move(log)) {
  starting_ = true;
  ensure();
  starting_ = false;
}

RedisStore::~RedisStore() {
  if (ctx_) redisFree(ctx_);
}

void RedisStore::failed(const std::string& what) {
  const std::string why = ctx_ && ctx_->err ? std::string(ctx_->errstr) : what;
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
  backoff_s_ = std::clamp(backoff_s_ * 2, opts_.backoff_min_s, opts_.backoff_max_s);
  retry_at_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                      std::chrono::duration<double>(backoff_s_));
  if (up_.exchange(false) || !ever_up_) {
    if (log_ && !(starting_ && !refused_.empty()))
      log_("kv tier redis: unavailable (" + ep_.where() + ": " + why + "); serving without it, reconnecting with backoff");
    ever_up_ = true;  // one line for a server that was never reachable, too
  }
}

std::string RedisStore::scrub(std::string text) const {
  if (ep_.password.empty()) return text;
  for (size_t at = text.find(ep_.password); at != std::string::npos; at = text.find(ep_.password, at + 3))
    text.replace(at, ep_.password.size(), "***");
  return text;
}

// The server's words and what to change for the replies a handshake gets.
static std::string refusal_advice(const std::string& text) {
  const auto starts = [&](const char* p) { return text.rfind(p, 0) == 0; };
  if (starts("NOAUTH"))
    return "the server requires a password (" + text + "); give it in --kv-redis-password-file FILE";
  if (starts("WRONGPASS") || text.find("invalid password") != std::string::npos)
    return "the server refused the credentials (" + text +
           "); check the password (--kv-redis-password-file, or the URL) and the user name in --kv-redis";
  if (text.find("without any password configured") != std::string::npos || text.find("no password is set") != std::string::npos)
    return "the server has no password set (" + text + "); drop the password from --kv-redis / --kv-redis-password-file";
  if (starts("NOPERM"))
    return "the user may not run the tier's commands (" + text +
           "); grant it the keys ~kvs:* and GET SET SADD SMEMBERS DEL EXPIRE PEXPIRE SCAN INFO PING SELECT";
  return "the server answered: " + text;
}

bool RedisStore::handshake_step(redisReply* r, const char* step) {
  if (!r) {
    failed(std::string("no answer to ") + step);
    return false;
  }
  if (r->type == REDIS_REPLY_ERROR) {
    refused_ = scrub(refusal_advice(std::string(r->str, r->len)));
    freeReplyObject(r);
    failed(refused_);
    return false;
  }
  freeReplyObject(r);
  return true;
}

// A reconnect is a new session: AUTH and SELECT again every time. PING
// last, so a server that wants a password we lack says so (NOAUTH) at
// connect, not at the first block.
bool RedisStore::handshake() {
  const std::string& u = ep_.user;
  const std::string& p = ep_.password;
  if (!p.empty()) {
    void* r = u.empty() ? redisCommand(ctx_, "AUTH %b", p.data(), p.size())
                        : redisCommand(ctx_, "AUTH %b %b", u.data(), u.size(), p.data(), p.size());
    if (!handshake_step(static_cast<redisReply*>(r), "AUTH")) return false;
  }
  if (ep_.db != 0 && !handshake_step(static_cast<redisReply*>(redisCommand(ctx_, "SELECT %d", ep_.db)), "SELECT"))
    return false;
  return handshake_step(static_cast<redisReply*>(redisCommand(ctx_, "PING")), "PING");
}

// Before a reconnect (not at start: the caller has just read it).
void RedisStore::reload_password() {
  if (!opts_.password_source || starting_) return;
  std::string p;
  try {
    p = opts_.password_source();
  } catch (const std::exception& e) {
    if (log_ && !reload_failed_)
      log_(std::string("kv tier redis: cannot read the password again (") + scrub(e.what()) +
           "); reconnecting with the last one");
    reload_failed_ = true;
    return;
  }
  reload_failed_ = false;
  if (p == ep_.password) return;
  ep_.password = std::move(p);
  if (log_) log_("kv tier redis: the password file changed; reconnecting with the new password");
}

bool RedisStore::ensure() {
  if (ctx_) return true;
  if (std::chrono::steady_clock::now() < retry_at_) return false;
  reload_password();
  ctx_ = redisConnectWithTimeout(ep_.host.c_str(), ep_.port, to_timeval(opts_.connect_timeout_s));
  if (!ctx_ || ctx_->err) {
    failed("cannot connect");
    return false;
  }
  redisSetTimeout(ctx_, to_timeval(opts_.command_timeout_s));
  if (!handshake()) return false;
  refused_.clear();
  backoff_s_ = 0;
  if (!up_.exchange(true) && log_)
    log_("kv tier redis: connected to " + ep_.where() + (ep_.user.empty() ? "" : " as " + ep_.user));
  ever_up_ = true;
  if (!capped_) cap_ttls();
  if (ctx_) refresh_bytes();  // not 0 until the first sweep
  return ctx_ != nullptr;
}

// One bad key is a bad entry for its caller to drop, not an outage.
static bool wrong_type(const redisReply* r) {
  return r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with("WRONGTYPE");
}

redisReply* RedisStore::command(const char* fmt, ...) {
  if (!ensure()) return nullptr;
  va_list ap;
  va_start(ap, fmt);
  auto* r = static_cast<redisReply*>(redisvCommand(ctx_, fmt, ap));
  va_end(ap);
  if (!r || (r->type == REDIS_REPLY_ERROR && !wrong_type(r))) {
    // The server's own words (NOAUTH, OOM ...) say what to fix.
    const std::string why = r && r->str ? "the server answered: " + scrub(std::string(r->str, r->len)) : "command failed";
    if (r) freeReplyObject(r);
    failed(why);
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
  if (r && wrong_type(r)) {  // not our set: replace it
    freeReplyObject(r);
    if ((r = command("DEL %b", set.data(), set.size()))) freeReplyObject(r);
    r = command("SADD %b %b", set.data(), set.size(), id.data(), id.size());
  }
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
  if (wrong_type(r)) {
    // Handed on as an empty entry: the tier set rejects it like any bad
    // entry (logged, counted, deleted) and recomputes.
    out.clear();
    st = GetStatus::Hit;
  } else if (r->type == REDIS_REPLY_STRING) {
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
  if (r->type == REDIS_REPLY_ARRAY) {  // a value of another type has no members: just deleted below
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
  refresh_bytes();
  return 0;
}

void RedisStore::refresh_bytes() {
  redisReply* r = command("INFO memory");
  if (!r) return;
  if (r->type == REDIS_REPLY_STRING) {
    const std::string info(r->str, r->len);
    const auto at = info.find("used_memory:");
    if (at != std::string::npos) bytes_ = std::stoll(info.substr(at + 12));
  }
  freeReplyObject(r);
}

// Keys written under a longer retention than the one now in force would
// keep their TTL: on the first connection every key of the tier gets at
// most the current one. SCAN walks them in batches, each batch one pipeline
// of PEXPIRE ... LT (never lengthens a TTL; Redis 7.0 and later).
// Done once: a connection lost half way starts it again at the next one.
void RedisStore::cap_ttls() {
  if (opts_.max_ttl_s <= 0) {
    capped_ = true;
    return;
  }
  const long long ms = static_cast<long long>(opts_.max_ttl_s * 1000);
  int64_t entries = 0;
  std::string cursor = "0", refused;
  do {
    redisReply* r = command("SCAN %s MATCH kvs:[bs]:* COUNT %d", cursor.c_str(), kScanBatch);
    if (!r) return;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
      freeReplyObject(r);
      return;
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* keys = r->element[1];
    for (size_t i = 0; i < keys->elements; ++i)
      redisAppendCommand(ctx_, "PEXPIRE %b %lld LT", keys->element[i]->str, keys->element[i]->len, ms);
    for (size_t i = 0; i < keys->elements; ++i) {  // every reply is read, or the next command reads a stale one
      void* p = nullptr;
      if (redisGetReply(ctx_, &p) != REDIS_OK) {
        freeReplyObject(r);
        failed("no answer to PEXPIRE");
        return;
      }
      auto* e = static_cast<redisReply*>(p);
      if (e->type == REDIS_REPLY_ERROR && refused.empty()) refused = scrub(std::string(e->str, e->len));
      if (e->type == REDIS_REPLY_INTEGER && e->integer == 1 &&
          std::string_view(keys->element[i]->str, keys->element[i]->len).starts_with("kvs:b:"))
        ++entries;
      freeReplyObject(e);
    }
    freeReplyObject(r);
  } while (cursor != "0" && refused.empty());
  capped_ = true;
  if (!refused.empty() && log_)
    log_("kv tier redis: cannot cap the TTL of the entries already there to the retention now in force (the server "
         "answered: " + refused + "; PEXPIRE LT needs Redis 7.0); they keep the TTL they were written with");
  else if (entries > 0 && log_)
    log_("kv tier redis: " + std::to_string(entries) + " entries kept a TTL beyond the retention now in force (" +
         std::to_string(static_cast<long long>(opts_.max_ttl_s)) + " s); capped to it");
}

}  // namespace kvs::tiers
