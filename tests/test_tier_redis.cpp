// The Redis tier's store against a real redis-server the test starts: the
// URL with credentials (percent-decoded, never shown), AUTH with a password
// and with an ACL user on every connection, a wrong or missing password as a
// refusal naming the server's reply, a value of the wrong type as a bad
// entry (a miss, deleted) rather than an outage, and the TTL of keys already
// there capped to the retention now in force.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "crypto/kdf.h"
#include "redis_server.h"
#include "test_util.h"
#include "tiers/redis_store.h"
#include "tiers/sealed_block.h"
#include "tiers/tier_set.h"

using namespace kvs;
using namespace kvs::tiers;
using test::have_redis;
using test::Redis;

namespace {

// A password with characters a URL must escape.
const std::string kPassword = "s3cr@t:p/w%";
const std::string kPasswordInUrl = "s3cr%40t%3Ap%2Fw%25";

struct Logged {
  std::vector<std::string> lines;
  RedisStore::Log fn() {
    return [this](const std::string& s) { lines.push_back(s); };
  }
  std::string all() const {
    std::string s;
    for (auto& l : lines) s += l + "\n";
    return s;
  }
};

RedisEndpoint at(const Redis& r, const std::string& user = "", const std::string& password = "") {
  RedisEndpoint ep;
  ep.host = "127.0.0.1";
  ep.port = r.port;
  ep.user = user;
  ep.password = password;
  return ep;
}

BlobMeta meta_for(int64_t ttl_s) { return {ScopeFp{}, int64_t(std::time(nullptr)) + ttl_s, ""}; }

// A write to a connection the server closed must be an error, not the end
// of the test process.
const bool kNoSigpipe = [] {
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}();

TEST(RedisUrl, CredentialsArePercentDecodedAndNeverShown) {
  const RedisEndpoint ep = parse_redis_url("redis://kv%2Duser:" + kPasswordInUrl + "@cache.local:6380/2");
  EXPECT_EQ(ep.user, "kv-user");
  EXPECT_EQ(ep.password, kPassword);
  EXPECT_EQ(ep.host, "cache.local");
  EXPECT_EQ(ep.port, 6380);
  EXPECT_EQ(ep.db, 2);
  const RedisEndpoint unescaped = parse_redis_url("redis://:pa@ss/w@h:1");  // the last '@' ends the credentials
  EXPECT_EQ(unescaped.password, "pa@ss/w");
  EXPECT_EQ(unescaped.host, "h");
  EXPECT_EQ(parse_redis_url("redis://alice@h:1").user, "alice");  // password from the file
  EXPECT_EQ(redis_url_for_logs("redis://alice:" + kPasswordInUrl + "@h:1/2"), "redis://alice:***@h:1/2");
  EXPECT_EQ(redis_url_for_logs("redis://h:1"), "redis://h:1");
  for (const std::string& bad : {"redis://:" + kPasswordInUrl + "@:1", "redis://:" + kPasswordInUrl + "@h:99999",
                                "redis://:bad%zz" + kPasswordInUrl + "@h:1", "http://:" + kPasswordInUrl + "@h:1"}) {
    try {
      parse_redis_url(bad);
      ADD_FAILURE() << "accepted " << redis_url_for_logs(bad);
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).find(kPasswordInUrl), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("bad%zz"), std::string::npos) << e.what();
    }
  }
  try {
    parse_redis_url("rediss://h:6379");
    ADD_FAILURE() << "rediss accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no TLS"), std::string::npos) << e.what();
  }
}

TEST(RedisStore, PasswordAuthRoundTripsAndAWrongOneIsRefusedByName) {
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  Redis redis;
  redis.extra = {"--requirepass", kPassword};
  redis.password = kPassword;
  ASSERT_TRUE(redis.start());
  Logged log;
  RedisStore good(at(redis, "", kPassword), {}, log.fn());
  EXPECT_TRUE(good.refused().empty()) << good.refused();
  EXPECT_GT(good.bytes(), 0) << "used_memory is read at connect, not first at the sweep (audit 9 L11)";
  const std::vector<uint8_t> blob = {1, 2, 3, 4, 5};
  ASSERT_EQ(good.put("abc", blob, meta_for(60)), PutStatus::Stored);
  std::vector<uint8_t> out;
  ASSERT_EQ(good.get("abc", out), GetStatus::Hit);
  EXPECT_EQ(out, blob);
  EXPECT_TRUE(good.available());

  RedisStore wrong(at(redis, "", "not-" + kPassword), {}, log.fn());
  EXPECT_FALSE(wrong.available());
  EXPECT_NE(wrong.refused().find("WRONGPASS"), std::string::npos) << wrong.refused();
  EXPECT_NE(wrong.refused().find("--kv-redis-password-file"), std::string::npos) << wrong.refused();
  EXPECT_EQ(wrong.get("abc", out), GetStatus::Failed);

  RedisStore none(at(redis), {}, log.fn());
  EXPECT_NE(none.refused().find("NOAUTH"), std::string::npos) << none.refused();
  EXPECT_NE(none.refused().find("--kv-redis-password-file"), std::string::npos) << none.refused();
  EXPECT_EQ(log.all().find(kPassword), std::string::npos) << log.all();
  EXPECT_EQ(wrong.refused().find(kPassword), std::string::npos);
}

TEST(RedisStore, AclUserAuthenticatesOnEveryReconnect) {
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  Redis redis;
  redis.extra = {"--user", "kvtier", "on", ">" + kPassword, "~kvs:*", "+@all", "--user", "default", "off"};
  redis.user = "kvtier";
  redis.password = kPassword;
  ASSERT_TRUE(redis.start());
  Logged log;
  RedisStore s(at(redis, "kvtier", kPassword), {}, log.fn());
  ASSERT_TRUE(s.refused().empty()) << s.refused();
  const std::vector<uint8_t> blob = {9, 8, 7};
  ASSERT_EQ(s.put("u1", blob, meta_for(60)), PutStatus::Stored);
  // Drop every client: the store's next command fails, then it reconnects
  // (after its backoff) and must log in again to read the entry.
  redis.cli("client kill type normal");
  std::vector<uint8_t> out;
  const bool back = test::eventually([&] { return s.get("u1", out) == GetStatus::Hit; }, 5);
  EXPECT_TRUE(back) << log.all();
  EXPECT_EQ(out, blob);
  EXPECT_NE(log.all().find("unavailable"), std::string::npos) << "the connection was not dropped:\n" << log.all();
  EXPECT_EQ(log.all().find(kPassword), std::string::npos) << log.all();

  RedisStore other(at(redis, "kvtier", "wrong"), {}, log.fn());
  EXPECT_NE(other.refused().find("WRONGPASS"), std::string::npos) << other.refused();
}

// Rotating the password: changed on the server, the store's connection
// dropped, its reconnect refused (an outage) until the password file says
// the new one; no restart. An unreadable file keeps the last password.
TEST(RedisStore, APasswordRotatedOnTheServerAndInTheFileTakesEffectAtTheNextReconnect) {
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  const std::string first = "first-" + kPassword, second = "second-" + kPassword;
  Redis redis;
  redis.extra = {"--requirepass", first};
  redis.password = first;
  ASSERT_TRUE(redis.start());
  Logged log;
  std::string in_file = first;
  bool unreadable = false;
  RedisOptions o;
  o.backoff_min_s = 0.02;
  o.backoff_max_s = 0.1;
  o.password_source = [&] {
    if (unreadable) throw std::runtime_error("cannot open the password file");
    return in_file;
  };
  RedisStore s(at(redis, "", first), o, log.fn());
  ASSERT_TRUE(s.refused().empty()) << s.refused();
  const std::vector<uint8_t> blob = {4, 2};
  ASSERT_EQ(s.put("rot", blob, meta_for(60)), PutStatus::Stored);

  EXPECT_EQ(redis.cli("config set requirepass '" + second + "'"), "OK");
  redis.password = second;
  redis.cli("client kill type normal");
  std::vector<uint8_t> out;
  unreadable = true;
  // The old password, again and again: refused, so an outage.
  EXPECT_TRUE(test::eventually([&] { return s.get("rot", out) == GetStatus::Failed && !s.refused().empty(); }, 5))
      << log.all();
  EXPECT_NE(s.refused().find("WRONGPASS"), std::string::npos) << s.refused();
  EXPECT_FALSE(s.available());
  unreadable = false;
  in_file = second;
  EXPECT_TRUE(test::eventually([&] { return s.get("rot", out) == GetStatus::Hit; }, 5)) << log.all();
  EXPECT_EQ(out, blob);
  EXPECT_TRUE(s.available());
  const std::string all = log.all();
  EXPECT_NE(all.find("cannot read the password again"), std::string::npos) << all;
  EXPECT_EQ(all.find("cannot read the password again"), all.rfind("cannot read the password again")) << all;
  EXPECT_NE(all.find("the password file changed"), std::string::npos) << all;
  EXPECT_EQ(all.find(first), std::string::npos) << all;
  EXPECT_EQ(all.find(second), std::string::npos) << all;
}

TEST(RedisStore, WrongTypeValueIsABadEntryNotAnOutage) {
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  Redis redis;
  ASSERT_TRUE(redis.start());
  const crypto::SecretKey master = crypto::SecretKey::random();
  const TierIdentity id = make_tier_identity("model-a", "f32 block 4", 256);
  std::vector<std::string> lines;
  std::vector<std::unique_ptr<BlobStore>> st;
  st.push_back(std::make_unique<RedisStore>(at(redis), RedisOptions{}, [&](const std::string& s) { lines.push_back(s); }));
  BlobStore* store = st.back().get();
  TierSet t(master, id, std::move(st), TierSetOptions{}, [&](const std::string& s) { lines.push_back(s); });
  const Scope sc = make_scope("model-a", "tenant");
  BlockKey k{};
  k[0] = 7;
  t.offer(k, sc, std::vector<uint8_t>(id.block_bytes, 3));
  t.flush();
  ASSERT_EQ(t.stats().tiers[0].stores, 1);
  const std::string key = "kvs:b:" + entry_id(k, id);
  ASSERT_EQ(redis.cli("del " + key), "1");
  ASSERT_EQ(redis.cli("rpush " + key + " x"), "1");
  // The scope's id set of the wrong type too: a write must replace it.
  const std::string set = "kvs:s:" + hex(scope_fingerprint(sc));
  redis.cli("del " + set);
  redis.cli("rpush " + set + " x");

  const uint64_t ticket = t.prefetch({k}, sc, 0);
  ASSERT_TRUE(test::eventually([&] { return !t.pending(ticket); }, 5));
  EXPECT_FALSE(t.staged(k));
  EXPECT_EQ(t.stats().tiers[0].errors, 1);
  EXPECT_TRUE(store->available());
  EXPECT_EQ(redis.cli("exists " + key), "0") << "the bad value must be deleted";
  t.offer(k, sc, std::vector<uint8_t>(id.block_bytes, 3));  // recomputed and stored again
  t.flush();
  EXPECT_EQ(t.stats().tiers[0].stores, 2);
  EXPECT_EQ(redis.cli("type " + set), "set");
  EXPECT_TRUE(store->available());
  std::string all;
  for (auto& l : lines) all += l + "\n";
  EXPECT_EQ(all.find("unavailable"), std::string::npos) << all;
}

TEST(RedisStore, KeysAlreadyThereGetAtMostTheRetentionNowInForce) {
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  Redis redis;
  ASSERT_TRUE(redis.start());
  // More keys than one SCAN batch, written under a day's retention.
  std::string script;
  for (int i = 0; i < 1300; ++i) script += "SET kvs:b:old" + std::to_string(i) + " v EX 86400\n";
  script += "SET kvs:b:forever v\nSET kvs:b:short v EX 20\nSADD kvs:s:scope a\nEXPIRE kvs:s:scope 86400\n"
            "SET other:key v EX 86400\n";
  const std::string file = test::temp_dir() + "/redis-cap.txt";
  { FILE* f = std::fopen(file.c_str(), "w"); std::fputs(script.c_str(), f); std::fclose(f); }
  redis.cli("< " + file + " >/dev/null; true");  // piped: one redis-cli for every command
  ASSERT_EQ(redis.cli("dbsize"), "1304");
  Logged log;
  RedisOptions o;
  o.max_ttl_s = 60;
  RedisStore s(at(redis), o, log.fn());
  ASSERT_TRUE(s.available());
  for (const std::string k : {"kvs:b:old0", "kvs:b:old1299", "kvs:b:forever", "kvs:s:scope"}) {
    const long ttl = std::stol(redis.cli("ttl " + k));
    EXPECT_GT(ttl, 0) << k;
    EXPECT_LE(ttl, 60) << k;
  }
  EXPECT_LE(std::stol(redis.cli("ttl kvs:b:short")), 20);  // a shorter TTL is never lengthened
  EXPECT_GT(std::stol(redis.cli("ttl other:key")), 3600);   // not the tier's key
  ASSERT_EQ(log.lines.size(), 2u) << log.all();             // connected, then the one count
  EXPECT_NE(log.lines[1].find("1301 entries"), std::string::npos) << log.all();
}

}  // namespace
