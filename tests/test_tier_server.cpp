// The KV tiers in `kvserve serve` processes: the disk tier serves a restarted
// server's prefix with identical output; a loose key file stops the start
// with the fix; a revoke deletes the tenant's files; two replicas share
// blocks through a redis-server the test starts, with a password too; and
// redis killed mid-run costs no request.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "http_client.h"
#include "kvs_process.h"
#include "redis_server.h"
#include "server/tenants.h"
#include "test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace kvs;
using test::KvsProcess;

namespace {

std::string stories() { return test::shared("models/stories260K/stories260K.gguf"); }

// A prompt of several full blocks (block size 16) for the stories model.
const std::string kPrompt =
    "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends. "
    "One day she saw a big dog near the tree and she was very happy. The dog wanted to play with the ball.";

std::string fresh(const std::string& name) {
  const std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::unique_ptr<KvsProcess> serve(std::vector<std::string> extra, const std::string& ready = "kvserve: kv tiers") {
  std::vector<std::string> a = {"serve", "-m", stories(), "--port", "0", "--threads", "1", "--kv-memory", "2MiB"};
  a.insert(a.end(), extra.begin(), extra.end());
  return std::make_unique<KvsProcess>(a, ready, 60);
}

json complete(int port, const std::string& key = "", int max_tokens = 24) {
  std::map<std::string, std::string> h;
  if (!key.empty()) h["authorization"] = "Bearer " + key;
  const test::HttpReply r = test::http_request(
      port, "POST", "/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", max_tokens}, {"temperature", 0}}.dump(),
      h, 60);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? json::parse(r.body) : json();
}

int cached(const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); }

// Waits until a metric equals `want`.
double wait_metric_eq(int port, const std::string& name, double want, double timeout_s = 10) {
  double v = -1;
  for (int i = 0; i < int(timeout_s * 50); ++i) {
    if ((v = test::metric_value(port, name)) == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return v;
}

int count_entries(const std::string& dir) {
  int n = 0;
  for (auto& e : fs::recursive_directory_iterator(dir)) n += e.path().extension() == ".kvb";
  return n;
}

TEST(TierServer, DiskTierSurvivesARestartWithIdenticalOutput) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  const std::string d = fresh("restart");
  const std::vector<std::string> flags = {"--kv-disk", d + "/tier", "--kv-key-file", d + "/master.key"};
  std::string first_text;
  {
    auto s = serve(flags);
    const json r = complete(s->port());
    EXPECT_EQ(cached(r), 0);
    first_text = r["choices"][0]["text"];
    ASSERT_EQ(wait_metric_eq(s->port(), "kvserve_kv_tier_queue_bytes", 0), 0);
    EXPECT_GE(test::metric_value(s->port(), "kvserve_kv_tier_stores_total{tier=\"disk\"}"), 3);
    EXPECT_EQ(s->stop(), 0);
  }
  struct stat st{};
  ASSERT_EQ(::stat((d + "/master.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_GE(count_entries(d + "/tier"), 3);
  auto s = serve(flags);
  const json r = complete(s->port());
  EXPECT_GE(cached(r), 32) << "the restarted server must load the prefix from disk";
  EXPECT_EQ(r["choices"][0]["text"], first_text);
  EXPECT_GE(test::metric_value(s->port(), "kvserve_kv_tier_hits_total{tier=\"disk\"}"), 2);
  EXPECT_EQ(test::metric_value(s->port(), "kvserve_kv_tier_errors_total{tier=\"disk\"}"), 0);
  // The dashboard shows the same tier counters (its snapshot is sampled once a second).
  const double hits = test::metric_value(s->port(), "kvserve_kv_tier_hits_total{tier=\"disk\"}");
  json tiers;
  for (int i = 0; i < 40; ++i) {
    const test::HttpReply snap = test::http_request(s->port(), "GET", "/dashboard/snapshot", "", {}, 30);
    ASSERT_EQ(snap.status, 200) << snap.body;
    tiers = json::parse(snap.body)["tiers"];
    if (tiers.size() == 1 && tiers[0]["hits"].get<double>() == hits) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(tiers.size(), 1u);
  EXPECT_EQ(tiers[0]["tier"], "disk");
  EXPECT_EQ(tiers[0]["hits"].get<double>(), hits);
  s->stop();
  EXPECT_NE(s->log().find("tier_tokens="), std::string::npos);
}

TEST(TierServer, LooseKeyFileRefusesToStart) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  const std::string d = fresh("loose");
  std::ofstream(d + "/k.key") << std::string(64, 'a') << "\n";
  ::chmod((d + "/k.key").c_str(), 0644);
  std::string out, err;
  const int rc = test::run_kvserve({"serve", "-m", stories(), "--port", "0", "--kv-disk", d + "/tier", "--kv-key-file",
                                    d + "/k.key"},
                                   &out, &err);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("chmod 600"), std::string::npos) << err;
  EXPECT_NE(err.find("--kv-key-file"), std::string::npos) << err;
}

TEST(TierServer, RevokeDeletesTheTenantsFiles) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  const std::string d = fresh("revoke");
  std::ofstream(d + "/keys.json")
      << json{{"keys",
               {{{"key_sha256", server::sha256_hex("key-a")}, {"tenant", "a"}},
                {{"key_sha256", server::sha256_hex("key-b")}, {"tenant", "b"}},
                {{"key_sha256", server::sha256_hex("key-admin")}, {"tenant", "ops"}, {"admin", true}}}}}
             .dump();
  auto s = serve({"--kv-disk", d + "/tier", "--kv-key-file", d + "/k.key", "--api-keys", d + "/keys.json"});
  const int port = s->port();
  // A request's blocks are all queued when its response is complete; the
  // queue empties only after each one is written.
  const std::string stores = "kvserve_kv_tier_stores_total{tier=\"disk\"}", queue = "kvserve_kv_tier_queue_bytes";
  complete(port, "key-a");
  ASSERT_EQ(wait_metric_eq(port, queue, 0), 0);
  const double after_a = test::metric_value(port, stores);
  complete(port, "key-b");
  ASSERT_EQ(wait_metric_eq(port, queue, 0), 0);
  const double after_b = test::metric_value(port, stores);
  ASSERT_GE(after_a, 3);
  ASSERT_GE(after_b - after_a, 3);
  ASSERT_EQ(count_entries(d + "/tier"), int(after_b));
  const test::HttpReply rv = test::http_request(port, "POST", "/admin/tenants/a/revoke", "{}",
                                                {{"authorization", "Bearer key-admin"}}, 30);
  ASSERT_EQ(rv.status, 200) << rv.body;
  int left = -1;
  for (int i = 0; i < 250 && (left = count_entries(d + "/tier")) != int(after_b - after_a); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(left, int(after_b - after_a)) << "a's files must be gone, b's must stay";
  const json again = complete(port, "key-a");  // new version: recomputed, never the old entries
  EXPECT_EQ(cached(again), 0);
  s->stop();
}

using test::have_redis;
using test::Redis;

TEST(TierServer, ReplicaBHitsBlocksReplicaAComputedThroughRedis) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  Redis redis;
  ASSERT_TRUE(redis.start());
  const std::string d = fresh("replicas");
  const std::vector<std::string> flags = {"--kv-redis", redis.url(), "--kv-key-file", d + "/shared.key"};
  auto a = serve(flags);
  auto b = serve(flags);
  const json ra = complete(a->port());
  ASSERT_EQ(wait_metric_eq(a->port(), "kvserve_kv_tier_queue_bytes", 0), 0);
  EXPECT_GE(test::metric_value(a->port(), "kvserve_kv_tier_stores_total{tier=\"redis\"}"), 3);
  const json rb = complete(b->port());
  EXPECT_GE(cached(rb), 32) << "B must load A's prefix from redis";
  EXPECT_EQ(rb["choices"][0]["text"], ra["choices"][0]["text"]);
  EXPECT_GE(test::metric_value(b->port(), "kvserve_kv_tier_hits_total{tier=\"redis\"}"), 2);
  EXPECT_EQ(test::metric_value(b->port(), "kvserve_kv_tier_available{tier=\"redis\"}"), 1);
}

TEST(TierServer, RedisKilledMidRunFailsNoRequest) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  Redis redis;
  ASSERT_TRUE(redis.start());
  const std::string d = fresh("redis-dies");
  auto s = serve({"--kv-redis", redis.url(), "--kv-key-file", d + "/k.key"});
  const int port = s->port();
  int ok = 0;
  const int n = 12;
  for (int i = 0; i < n; ++i) {
    if (i == 4) redis.kill9();
    const test::HttpReply r = test::http_request(
        port, "POST", "/v1/completions",
        json{{"prompt", kPrompt + " number " + std::to_string(i)}, {"max_tokens", 8}, {"temperature", 0}}.dump(), {}, 60);
    ok += r.status == 200;
  }
  EXPECT_EQ(ok, n) << s->log();
  EXPECT_EQ(wait_metric_eq(port, "kvserve_kv_tier_available{tier=\"redis\"}", 0), 0);
  EXPECT_GE(test::metric_value(port, "kvserve_kv_tier_errors_total{tier=\"redis\"}"), 1);
  // Back on the same port: the tier reconnects by itself.
  Redis again;
  again.port = redis.port;
  ASSERT_TRUE(again.start());
  complete(port);
  double avail = 0;
  for (int i = 0; i < 150 && avail < 1; ++i) {
    complete(port, "", 1);
    avail = test::metric_value(port, "kvserve_kv_tier_available{tier=\"redis\"}");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(avail, 1);
  s->stop();
  const std::string log = s->log();
  size_t lines = 0;
  for (size_t at = log.find("kv tier redis: unavailable"); at != std::string::npos; at = log.find("kv tier redis: unavailable", at + 1)) ++lines;
  EXPECT_EQ(lines, 1u) << "one line per outage, not one per request:\n" << log;
}

TEST(TierServer, FrozenRedisIsMarkedUnavailableAndRequestsGoOn) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  Redis redis;
  ASSERT_TRUE(redis.start());
  const std::string d = fresh("redis-frozen");
  auto s = serve({"--kv-redis", redis.url(), "--kv-key-file", d + "/k.key"});
  const int port = s->port();
  complete(port);
  ::kill(redis.pid, SIGSTOP);  // slow rather than dead: connections hang
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const test::HttpReply r = test::http_request(
        port, "POST", "/v1/completions",
        json{{"prompt", kPrompt + " frozen " + std::to_string(i)}, {"max_tokens", 4}, {"temperature", 0}}.dump(), {}, 60);
    EXPECT_EQ(r.status, 200);
    // Bounded by the tier's command timeout and the queue head's tier wait.
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
  EXPECT_EQ(wait_metric_eq(port, "kvserve_kv_tier_available{tier=\"redis\"}", 0), 0);
  ::kill(redis.pid, SIGCONT);
  s->stop();
}

// Redis with requirepass: the password file logs both replicas in (a block
// round-trips from A to B), a wrong or missing password stops the start
// with the server's reply and the option to fix, and the password shows in
// no output, the URL form included.
TEST(TierServer, RedisPasswordLogsInAndAWrongOneStopsTheStart) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  const std::string pw = "tier-p@ss-4711";
  Redis redis;
  redis.extra = {"--requirepass", pw};
  redis.password = pw;
  ASSERT_TRUE(redis.start());
  const std::string d = fresh("redis-auth");
  auto secret = [&](const std::string& name, const std::string& text) {
    std::ofstream(d + "/" + name) << text << "\n";
    ::chmod((d + "/" + name).c_str(), 0600);
    return d + "/" + name;
  };
  const std::vector<std::string> flags = {"--kv-redis", redis.url(), "--kv-redis-password-file", secret("pw", pw),
                                          "--kv-key-file", d + "/k.key"};
  auto a = serve(flags);
  const json ra = complete(a->port());
  ASSERT_EQ(wait_metric_eq(a->port(), "kvserve_kv_tier_queue_bytes", 0), 0);
  EXPECT_GE(test::metric_value(a->port(), "kvserve_kv_tier_stores_total{tier=\"redis\"}"), 3);
  auto b = serve({"--kv-redis", "redis://:tier-p%40ss-4711@127.0.0.1:" + std::to_string(redis.port), "--kv-key-file",
                  d + "/k.key"});
  const json rb = complete(b->port());
  EXPECT_GE(cached(rb), 32) << "B must load A's prefix from redis";
  EXPECT_EQ(rb["choices"][0]["text"], ra["choices"][0]["text"]);
  const test::HttpReply m = test::http_request(b->port(), "GET", "/metrics", "", {}, 30);
  EXPECT_EQ(m.body.find(pw), std::string::npos);
  EXPECT_EQ(b->find("kv tiers: redis (redis://:\\*\\*\\*@[^ ]+)"), "redis://:***@127.0.0.1:" + std::to_string(redis.port));
  EXPECT_EQ(a->stop(), 0);
  EXPECT_EQ(b->stop(), 0);
  for (const auto* p : {a.get(), b.get()}) {
    std::string out = p->log();
    for (auto& l : p->lines()) out += l + "\n";
    EXPECT_EQ(out.find(pw), std::string::npos) << out;
    EXPECT_EQ(out.find("tier-p%40ss"), std::string::npos) << out;
  }

  auto start = [&](std::vector<std::string> tier) {
    std::vector<std::string> args = {"serve", "-m", stories(), "--port", "0", "--threads", "1", "--kv-key-file",
                                     d + "/k.key"};
    args.insert(args.end(), tier.begin(), tier.end());
    std::string out, err;
    EXPECT_NE(test::run_kvserve(args, &out, &err), 0) << err;
    return out + err;
  };
  const std::string wrong = start({"--kv-redis", redis.url(), "--kv-redis-password-file", secret("bad", "guess-0815")});
  EXPECT_NE(wrong.find("WRONGPASS"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("--kv-redis-password-file"), std::string::npos) << wrong;
  EXPECT_EQ(wrong.find("guess-0815"), std::string::npos) << wrong;
  const std::string none = start({"--kv-redis", redis.url()});
  EXPECT_NE(none.find("NOAUTH"), std::string::npos) << none;
  const std::string loose = secret("loose", pw);
  ::chmod(loose.c_str(), 0644);
  const std::string mode = start({"--kv-redis", redis.url(), "--kv-redis-password-file", loose});
  EXPECT_NE(mode.find("chmod 600"), std::string::npos) << mode;
  EXPECT_EQ(mode.find(pw), std::string::npos) << mode;
}

// A retention shortened since entries went into Redis holds for them: the
// server caps their TTL at connect and says how many it capped.
TEST(TierServer, RedisEntriesGetAShortenedRetention) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present";
  if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
  Redis redis;
  ASSERT_TRUE(redis.start());
  ASSERT_EQ(redis.cli("set kvs:b:old-entry v ex 86400"), "OK");
  const std::string d = fresh("redis-retention");
  auto s = serve({"--kv-redis", redis.url(), "--kv-key-file", d + "/k.key", "--kv-retention", "60"});
  const long ttl = std::stol(redis.cli("ttl kvs:b:old-entry"));
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 60);
  EXPECT_EQ(s->stop(), 0);
  EXPECT_NE(s->log().find("1 entries kept a TTL beyond the retention now in force (60 s)"), std::string::npos)
      << s->log();
}

}  // namespace
