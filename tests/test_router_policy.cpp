// The router's pieces without sockets: the prefix index built from event
// batches, the routing policies, and the request hasher, whose block hashes
// must equal the ones a worker's KV manager keys the same request under
// (same tenant keys, same secret, same model identity).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "events/kv_event_codec.h"
#include "kv/kv_manager.h"
#include "router/pd_choice.h"
#include "router/peer_address.h"
#include "router/policy.h"
#include "router/prefix_index.h"
#include "router/request_hasher.h"
#include "router/upstream.h"
#include "router/workers.h"
#include "sched/clock.h"
#include "server/tenants.h"
#include "tokenizer/tokenizer.h"
#include "tools/byte_vocab.h"

using namespace kvs;
using namespace kvs::router;

namespace {

events::WireBatch batch(std::vector<events::WireEvent> ev) {
  events::WireBatch b;
  b.events = std::move(ev);
  return b;
}
events::WireEvent stored(std::vector<uint64_t> h) { return {events::WireEvent::Kind::Stored, std::move(h), {}, 16}; }
events::WireEvent removed(std::vector<uint64_t> h) { return {events::WireEvent::Kind::Removed, std::move(h), {}, 0}; }

}  // namespace

TEST(RouterIndex, LeadingHitsFollowStoresRemovalsAndClears) {
  PrefixIndex ix;
  ix.apply(0, batch({stored({1, 2, 3})}));
  ix.apply(1, batch({stored({1, 2})}));
  EXPECT_EQ(ix.leading_hits({1, 2, 3, 4}, 3), std::vector<int>({3, 2, 0}));
  // A hole breaks the chain: block 3 alone does not count.
  ix.apply(0, batch({removed({2})}));
  EXPECT_EQ(ix.leading_hits({1, 2, 3}, 2), std::vector<int>({1, 2}));
  ix.apply(1, batch({{events::WireEvent::Kind::Cleared, {}, {}, 0}}));
  EXPECT_EQ(ix.leading_hits({1, 2, 3}, 2), std::vector<int>({1, 0}));
  ix.predict(1, {1, 2, 3});
  EXPECT_EQ(ix.leading_hits({1, 2, 3}, 2), std::vector<int>({1, 3}));
  ix.clear_worker(0);
  ix.clear_worker(1);
  EXPECT_EQ(ix.size(), 0u);
}

TEST(RouterPolicy, CacheRoundRobinLeastLoad) {
  std::vector<Candidate> c = {{true, 0, 0}, {true, 10, 1}, {true, 0, 3}};
  // Cache: the worker holding 10 of 12 blocks wins despite one request.
  EXPECT_EQ(choose(Policy::Cache, c, 12, 0.1, 0), 1);
  // Heavily loaded, it loses to an idle worker.
  c[1].load = 20;
  EXPECT_EQ(choose(Policy::Cache, c, 12, 0.1, 0), 0);
  // Least load and round robin.
  EXPECT_EQ(choose(Policy::LeastLoad, c, 12, 0.1, 0), 0);
  EXPECT_EQ(choose(Policy::RoundRobin, c, 12, 0.1, 0), 0);
  EXPECT_EQ(choose(Policy::RoundRobin, c, 12, 0.1, 1), 1);
  EXPECT_EQ(choose(Policy::RoundRobin, c, 12, 0.1, 5), 2);
  // Down and already-tried workers are skipped; none left: -1.
  c[0].up = false;
  EXPECT_EQ(choose(Policy::LeastLoad, c, 12, 0.1, 0, {false, false, true}), 1);
  EXPECT_EQ(choose(Policy::Cache, c, 12, 0.1, 0, {false, true, true}), -1);
  // Equal costs rotate with the turn (new prefixes spread out).
  const std::vector<Candidate> idle = {{true, 0, 0}, {true, 0, 0}};
  EXPECT_NE(choose(Policy::Cache, idle, 4, 0.1, 0), choose(Policy::Cache, idle, 4, 0.1, 1));
}


TEST(RouterPolicy, TheSoonerRetryAfterWins) {
  EXPECT_TRUE(sooner_retry("1", "3"));
  EXPECT_FALSE(sooner_retry("3", "1"));
  EXPECT_FALSE(sooner_retry("2", "2"));
  // A readable value beats a missing or unreadable one, never the reverse.
  EXPECT_TRUE(sooner_retry("30", ""));
  EXPECT_TRUE(sooner_retry("30", "Wed, 21 Oct 2015 07:28:00 GMT"));
  EXPECT_FALSE(sooner_retry("", "30"));
  EXPECT_FALSE(sooner_retry("-1", "30"));
  EXPECT_FALSE(sooner_retry("1x", "30"));
}
TEST(RouterHasher, HashesEqualTheWorkersBlockKeys) {
  Vocab v = builtin_byte_vocab(300);
  v.add_bos = true;
  const auto tok = Tokenizer::create(v);
  const nlohmann::json keys = {
      {"keys", {{{"key_sha256", server::sha256_hex("secret-a")}, {"tenant", "a"}},
                {{"key_sha256", server::sha256_hex("secret-b")}, {"tenant", "b"}}}}};
  const std::vector<uint8_t> secret(32, 7);
  // The worker's registry and the router's: two processes, same files.
  auto worker = server::TenantRegistry::from_json(keys.dump(), "keys");
  auto router = server::TenantRegistry::from_json(keys.dump(), "keys");
  worker->set_secret(secret);
  router->set_secret(secret);
  const std::string identity = "model-identity";
  RequestHasher h(*tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), *router);
  h.set_model(identity, 4);

  const std::string body = R"({"prompt": "the quick brown fox jumps", "max_tokens": 4})";
  const PromptHashes got = h.hash("/v1/completions", body, "Bearer secret-a");
  // The worker: tokens as its ApiService makes them, scope as its
  // TenantRegistry + PagedEngine make it, keys as its KvManager stores them.
  const std::vector<int> ids = tok->encode("the quick brown fox jumps", true, false);
  const std::vector<int32_t> prompt(ids.begin(), ids.end());
  const Scope caller = worker->scope_for("a", identity, sched::steady_now());
  const Scope kv_scope =
      make_scope(identity, std::string_view(reinterpret_cast<const char*>(caller.bytes.data()), caller.bytes.size()));
  KvManager kv(64, KvManagerOptions::basic(4, true));
  KvEventLog log;
  kv.set_event_log(&log);
  const SeqAdmission a = kv.add_sequence(prompt, kv_scope);
  ASSERT_TRUE(kv.reserve(a.seq, int(prompt.size())));
  kv.commit(a.seq, prompt);
  std::vector<uint64_t> want;
  for (const KvEvent& e : log.events) want.push_back(events::block_hash(e.key));
  EXPECT_EQ(got.prompt_tokens, int(prompt.size()));
  ASSERT_EQ(got.hashes.size(), prompt.size() / 4);
  EXPECT_EQ(got.hashes, want);

  // Another tenant, the same words: other hashes. No key, bad JSON: none.
  EXPECT_NE(h.hash("/v1/completions", body, "Bearer secret-b").hashes, want);
  EXPECT_TRUE(h.hash("/v1/completions", body, "Bearer nope").hashes.empty());
  EXPECT_TRUE(h.hash("/v1/completions", "{not json", "Bearer secret-a").hashes.empty());
  // Chat goes through the template, as on the worker.
  const std::string chat = R"({"messages": [{"role": "user", "content": "hello there, how are you today?"}]})";
  EXPECT_FALSE(h.hash("/v1/chat/completions", chat, "Bearer secret-a").hashes.empty());
}

namespace {

WorkerView up(double load, std::string kv = {}, std::vector<std::string> peers = {}) {
  WorkerView v;
  v.up = true;
  v.load = load;
  v.kv_listen = std::move(kv);
  v.decode_peers = std::move(peers);
  return v;
}

}  // namespace

// Workers 0, 1 prefill; 2, 3 decode (KV at :9002, :9003).
TEST(RouterPdChoice, LeastLoadedReachablePairAndRotationOnTies) {
  const std::vector<std::string> both = {"127.0.0.1:9002", "127.0.0.1:9003"};
  std::vector<WorkerView> v = {up(0, "", both), up(0, "", both), up(0, "127.0.0.1:9002"), up(0, "127.0.0.1:9003")};
  const std::vector<int> pre = {0, 1}, dec = {2, 3};
  // Idle: successive turns spread over every worker of each role.
  std::set<int> seen_p, seen_d;
  for (uint64_t t = 0; t < 4; ++t) {
    const auto c = choose_pd(v, pre, dec, t);
    ASSERT_TRUE(c);
    seen_p.insert(c->prefill);
    seen_d.insert(c->decode);
    EXPECT_EQ(c->decode_kv, c->decode == 2 ? "127.0.0.1:9002" : "127.0.0.1:9003");
  }
  EXPECT_EQ(seen_p, std::set<int>({0, 1}));
  EXPECT_EQ(seen_d, std::set<int>({2, 3}));
  // The decode worker with streams running loses, whatever the turn.
  v[2].load = 4;
  for (uint64_t t = 0; t < 4; ++t) EXPECT_EQ(choose_pd(v, pre, dec, t)->decode, 3);
  v[1].load = 2;
  for (uint64_t t = 0; t < 4; ++t) EXPECT_EQ(choose_pd(v, pre, dec, t)->prefill, 0);
  // A decode worker down is skipped.
  v[3].up = false;
  for (uint64_t t = 0; t < 4; ++t) EXPECT_EQ(choose_pd(v, pre, dec, t)->decode, 2);
}

TEST(RouterPdChoice, OnlyDecodeWorkersThePrefillWorkerListsAndWhyNone) {
  // Prefill 0 knows only :9002, prefill 1 only :9003.
  std::vector<WorkerView> v = {up(0, "", {"127.0.0.1:9002"}), up(5, "", {"127.0.0.1:9003"}), up(3, "127.0.0.1:9002"),
                               up(0, "127.0.0.1:9003")};
  const std::vector<int> pre = {0, 1}, dec = {2, 3};
  // 0 + 3 (pair 0-2) beats 5 + 0 (pair 1-3); never 0-3 or 1-2.
  for (uint64_t t = 0; t < 4; ++t) {
    const auto c = choose_pd(v, pre, dec, t);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->prefill, 0);
    EXPECT_EQ(c->decode, 2);
  }
  v[2].up = false;
  EXPECT_EQ(choose_pd(v, pre, dec, 0)->prefill, 1);
  std::string why;
  v[1].up = false;
  EXPECT_FALSE(choose_pd(v, pre, dec, 0, &why));
  EXPECT_NE(why.find("--decode-peer"), std::string::npos) << why;
  v[3].up = false;
  EXPECT_FALSE(choose_pd(v, pre, dec, 0, &why));
  EXPECT_EQ(why, "no decode worker is up");
  v[0].up = false;
  EXPECT_FALSE(choose_pd(v, pre, dec, 0, &why));
  EXPECT_EQ(why, "no prefill worker is up");
  // A decode worker that has not said where its KV goes is not usable.
  v = {up(0, "", {"127.0.0.1:9002"}), up(0, "", {}), up(0, "")};
  EXPECT_FALSE(choose_pd(v, {0}, {2}, 0, &why));
}

// --decode-peer localhost:P and --kv-listen 127.0.0.1:P are one peer: paired
// by what they resolve to, and the prefill worker is sent its own spelling
// (it checks kv_decode_peer against its list). Unresolvable spellings that
// differ never pair, and the reason names both.
TEST(RouterPdChoice, PairsByResolvedAddressAndNamesTheStringsWhenNone) {
  const std::vector<std::string> lo = resolve_peer("localhost:9002");
  ASSERT_NE(std::find(lo.begin(), lo.end(), "127.0.0.1:9002"), lo.end());
  EXPECT_TRUE(resolve_peer("no-port").empty());
  std::vector<WorkerView> v = {up(0, "", {"localhost:9002"}), up(0, "127.0.0.1:9002")};
  v[0].decode_peer_addrs = {lo};
  v[1].kv_listen_addrs = resolve_peer("127.0.0.1:9002");
  const auto c = choose_pd(v, {0}, {1}, 0);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->decode_kv, "localhost:9002");
  v[0].decode_peers = {"other.invalid:9002"};
  v[0].decode_peer_addrs = {resolve_peer("other.invalid:9002")};
  std::string why;
  EXPECT_FALSE(choose_pd(v, {0}, {1}, 0, &why));
  EXPECT_NE(why.find("other.invalid:9002"), std::string::npos) << why;
  EXPECT_NE(why.find("127.0.0.1:9002"), std::string::npos) << why;
}

// Why --worker `spec` is refused ("" when accepted).
static std::string spec_refusal(const std::string& spec) {
  try {
    parse_worker_spec(spec);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// A worker URL is http://HOST:PORT: a path (or query) after it was dropped
// without a word, so the router sent /v1/completions to the host's root
// (audit 9 L1); a port with trailing junk was read up to the junk.
TEST(RouterWorkerSpec, AWorkerUrlWithAPathOrABadPortIsRefused) {
  const HostPort hp = parse_http_url("http://127.0.0.1:18101/");
  EXPECT_EQ(hp.host, "127.0.0.1");
  EXPECT_EQ(hp.port, 18101);
  EXPECT_EQ(spec_refusal("http://127.0.0.1:18101,tcp://127.0.0.1:15557"), "");
  for (const std::string bad : {"http://127.0.0.1:18101/some/prefix", "http://127.0.0.1:18101/v1", "http://h:1?x=1"}) {
    const std::string why = spec_refusal(bad);
    EXPECT_NE(why.find("'" + bad + "': a worker URL has no path"), std::string::npos) << why;
    EXPECT_NE(why.find("expected http://HOST:PORT"), std::string::npos) << why;
  }
  for (const std::string bad : {"http://127.0.0.1:18101x", "http://127.0.0.1:99999", "http://127.0.0.1:"})
    EXPECT_NE(spec_refusal(bad).find("the port must be 1..65535"), std::string::npos) << bad;
}
