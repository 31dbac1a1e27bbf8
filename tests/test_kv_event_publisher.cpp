// KV events on the wire: kvserve's publisher read by a Python subscriber
// (Debian python3-zmq, python3-msgpack) that checks every batch against
// vLLM's schema field by field (tests/kv_events/check_events.py), replay of
// batches lost in a gap, CURVE encryption and the key file, subscribers let
// in by their client key only, the bounded queue's drops, and a
// real `kvserve serve --kv-events` whose every event decodes.
#include <gtest/gtest.h>
#include <zmq.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "curve_key_files.h"
#include "events/curve_keys.h"
#include "events/event_publisher.h"
#include "kv/prefix_hash.h"
#include "http_client.h"
#include "kvs_process.h"
#include "test_util.h"

using namespace kvs;
using nlohmann::json;

namespace {

const std::string kScript = std::string(KVS_SOURCE_DIR) + "/tests/kv_events/check_events.py";

// The Python subscriber as a child with its stdout read line by line.
class Subscriber {
 public:
  explicit Subscriber(const std::string& args) {
    const std::string cmd = "timeout 120 /usr/bin/python3 '" + kScript + "' " + args + " 2>&1";
    p_ = popen(cmd.c_str(), "r");
    if (!p_) throw std::runtime_error("popen");
  }
  ~Subscriber() {
    if (p_) pclose(p_);
  }
  std::string line() {
    char buf[1 << 16];
    std::string out;
    while (fgets(buf, sizeof buf, p_)) {
      out += buf;
      if (!out.empty() && out.back() == '\n') break;
    }
    return out;
  }
  // Waits for "ready"; false (with the output in `why`) otherwise.
  bool ready(std::string* why) {
    const std::string l = line();
    if (l == "ready\n") return true;
    *why = l;
    return false;
  }
  json summary() {
    const std::string l = line();
    try {
      return json::parse(l);
    } catch (const std::exception&) {
      ADD_FAILURE() << "subscriber said: " << l;
      return json::object();
    }
  }

 private:
  FILE* p_ = nullptr;
};

bool python_available() {
  return std::system("/usr/bin/python3 -c 'import zmq, msgpack' > /dev/null 2>&1") == 0;
}

// A chain of `n` stored blocks after `parent` (none when null).
std::vector<KvEvent> chain(int n, uint8_t salt, const BlockKey* parent) {
  std::vector<KvEvent> v;
  const Scope sc = make_scope("model");
  BlockKey prev{};
  for (int i = 0; i < n; ++i) {
    const int32_t toks[4] = {salt, i, 7, 9};
    KvEvent e;
    e.kind = KvEvent::Kind::Stored;
    e.block = i;
    e.has_parent = i > 0 || parent;
    if (e.has_parent) e.parent = i > 0 ? prev : *parent;
    e.key = block_key(e.has_parent ? &e.parent : nullptr, toks, 4, sc);
    e.tokens.assign(toks, toks + 4);
    prev = e.key;
    v.push_back(e);
  }
  return v;
}

events::PublisherOptions local_options() {
  events::PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.block_size = 4;
  return o;
}

}  // namespace

TEST(KvEventPublisher, VllmSchemaAndReplayAfterAGap) {
  if (!python_available()) GTEST_SKIP() << "needs /usr/bin/python3 with zmq and msgpack (scripts/deps.sh)";
  events::EventPublisher pub(local_options());
  Subscriber sub("--pub " + pub.endpoint() + " --replay " + pub.replay_endpoint() +
                 " --block-size 4 --tokens --drop 2,3 --until-seq 5 --timeout 60");
  std::string why;
  ASSERT_TRUE(sub.ready(&why)) << why;
  // Sequence 0 was the AllBlocksCleared sent at start; then five batches.
  const auto a = chain(3, 1, nullptr);
  pub.offer(std::vector<KvEvent>(a), events::wall_seconds());  // seq 1
  pub.offer(chain(2, 2, &a[2].key), events::wall_seconds());   // seq 2 (lost)
  std::vector<KvEvent> rm(2);
  for (int i = 0; i < 2; ++i) {
    rm[size_t(i)].kind = KvEvent::Kind::Removed;
    rm[size_t(i)].key = a[size_t(i)].key;
  }
  pub.offer(std::move(rm), events::wall_seconds());            // seq 3 (lost)
  pub.offer(chain(1, 3, nullptr), events::wall_seconds());     // seq 4
  pub.offer(chain(2, 4, nullptr), events::wall_seconds());     // seq 5
  const json s = sub.summary();
  EXPECT_EQ(s["errors"], json::array()) << s.dump();
  EXPECT_EQ(s["seqs"], json({0, 1, 2, 3, 4, 5}));
  // Sequence 0 came live, with the first batch (audit 9 L7: sent at bind,
  // it was lost to every subscriber, and came only by replay); the two
  // dropped ones came back through the replay socket, ending with the -1
  // marker.
  EXPECT_EQ(s["replayed"], 2);
  EXPECT_EQ(s["gaps"], 1);
  EXPECT_EQ(s["replay_end"], 1);
  EXPECT_EQ(s["cleared"], 1);
  EXPECT_EQ(s["stored_blocks"], 3 + 2 + 1 + 2);
  EXPECT_EQ(s["removed_blocks"], 2);
  EXPECT_TRUE(s["parents_known"].get<bool>());
  EXPECT_EQ(pub.stats().replay_requests, 1);
}

TEST(KvEventPublisher, CurveEncryptsTheChannel) {
  if (!python_available()) GTEST_SKIP() << "needs /usr/bin/python3 with zmq and msgpack (scripts/deps.sh)";
  ASSERT_TRUE(zmq_has("curve"));
  const test::CurvePair worker = test::curve_pair();
  const std::string& pk = worker.pub;
  events::PublisherOptions o = local_options();
  o.curve = events::read_curve_keyfile(test::curve_key_file("kv-events.cert", worker), events::CurveEnd::Worker);
  events::EventPublisher pub(o);
  {
    // Without the server's key no handshake completes: nothing arrives.
    Subscriber plain("--pub " + pub.endpoint() + " --replay " + pub.replay_endpoint() +
                     " --block-size 4 --timeout 2");
    std::string why;
    ASSERT_TRUE(plain.ready(&why)) << why;
    pub.offer(chain(1, 1, nullptr), events::wall_seconds());
    const json s = plain.summary();
    EXPECT_EQ(s["seqs"], json::array()) << s.dump();
  }
  Subscriber sub("--pub " + pub.endpoint() + " --replay " + pub.replay_endpoint() + " --curve-server-key='" + pk +
                 "' --block-size 4 --tokens --until-seq 2 --timeout 60");
  std::string why;
  ASSERT_TRUE(sub.ready(&why)) << why;
  pub.offer(chain(2, 5, nullptr), events::wall_seconds());
  const json s = sub.summary();
  EXPECT_EQ(s["errors"], json::array()) << s.dump();
  EXPECT_EQ(s["seqs"], json({0, 1, 2}));
  EXPECT_EQ(s["stored_blocks"], 3);
}

TEST(CurveKeyFile, OneFormatForBothEnds) {
  const test::CurvePair w = test::curve_pair(), r = test::curve_pair(), x = test::curve_pair();
  const auto worker = events::read_curve_keyfile(test::curve_key_file("w.key", w, "", {r.pub, x.pub}),
                                                 events::CurveEnd::Worker);
  EXPECT_EQ(worker.public_key, w.pub);
  EXPECT_EQ(worker.secret_key, w.sec);
  EXPECT_EQ(worker.client_keys, std::vector<std::string>({r.pub, x.pub}));
  const auto router = events::read_curve_keyfile(test::curve_key_file("r.key", r, w.pub), events::CurveEnd::Subscriber);
  EXPECT_EQ(router.server_key, w.pub);
  EXPECT_EQ(router.public_key, r.pub);
  // zcert metadata and comments are ignored.
  const std::string zcert = "#   ZeroMQ CURVE **Secret** Certificate\nmetadata\n    name = \"w\"\ncurve\n"
                            "    public-key = \"" + w.pub + "\"\n    secret-key = \"" + w.sec + "\"\n";
  EXPECT_EQ(events::parse_curve_keys(zcert, "zcert", events::CurveEnd::Worker).public_key, w.pub);
  auto refused = [](const std::string& text, events::CurveEnd end, const std::string& says) {
    try {
      events::parse_curve_keys(text, "f", end);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  const std::string pair = "public-key = \"" + r.pub + "\"\nsecret-key = \"" + r.sec + "\"\n";
  refused(pair, events::CurveEnd::Subscriber, "no server-key");
  refused("public-key = \"" + w.pub + "\"\n", events::CurveEnd::Worker, "needs its own key pair");
  refused("public-key = \"" + w.pub + "\"\nsecret-key = \"" + r.sec + "\"\n", events::CurveEnd::Worker,
          "does not belong");
  refused(pair + "server-key = \"" + std::string(40, '~') + "\"\n", events::CurveEnd::Subscriber, "Z85");
  refused(pair + "server-key = " + w.pub + "\n", events::CurveEnd::Subscriber, "quoted");
  refused(pair + pair, events::CurveEnd::Worker, "twice");
}

// A worker key file with client-key lines lets in only those subscribers:
// a listed router gets the batches, another key completes no handshake and
// is counted.
TEST(KvEventPublisher, ClientKeysLetInOnlyListedSubscribers) {
  ASSERT_TRUE(zmq_has("curve"));
  const test::CurvePair w = test::curve_pair(), listed = test::curve_pair(), other = test::curve_pair();
  events::PublisherOptions o = local_options();
  o.replay_endpoint.clear();
  o.curve = events::read_curve_keyfile(test::curve_key_file("w.key", w, "", {listed.pub}), events::CurveEnd::Worker);
  events::EventPublisher pub(o);
  zmq::context_t ctx;
  auto subscribe = [&](const test::CurvePair& own) {
    zmq::socket_t s(ctx, zmq::socket_type::sub);
    s.set(zmq::sockopt::curve_serverkey, w.pub);
    s.set(zmq::sockopt::curve_publickey, own.pub);
    s.set(zmq::sockopt::curve_secretkey, own.sec);
    s.set(zmq::sockopt::subscribe, "");
    s.set(zmq::sockopt::linger, 0);
    s.connect(pub.endpoint());
    return s;
  };
  zmq::socket_t good = subscribe(listed), bad = subscribe(other);
  // Offer until the listed subscriber has a batch (it joins asynchronously).
  int got_good = 0, got_bad = 0;
  for (int i = 0; i < 100 && got_good == 0; ++i) {
    pub.offer(chain(1, uint8_t(i), nullptr), events::wall_seconds());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    zmq::message_t m;
    while (good.recv(m, zmq::recv_flags::dontwait)) ++got_good;
    while (bad.recv(m, zmq::recv_flags::dontwait)) ++got_bad;
  }
  EXPECT_GT(got_good, 0);
  EXPECT_EQ(got_bad, 0);
  for (int i = 0; i < 100 && pub.stats().curve_refused == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(pub.stats().curve_refused, 1);
  EXPECT_NE(pub.metrics_text().find("kvserve_kv_events_curve_refused_total"), std::string::npos);
}

TEST(KvEventPublisher, FullQueueDropsAndCounts) {
  events::PublisherOptions o = local_options();
  o.queue_batches = 1;
  events::EventPublisher pub(o);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) (pub.offer(chain(1, 1, nullptr), events::wall_seconds()) ? accepted : refused)++;
  // The engine side never waited; what did not fit was counted.
  EXPECT_GT(refused, 0);
  for (int i = 0; i < 200 && pub.stats().batches_published < accepted + 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto st = pub.stats();
  EXPECT_EQ(st.batches_published, accepted + 1);
  EXPECT_EQ(st.batches_dropped, refused);
  EXPECT_EQ(st.events_dropped, refused);
  EXPECT_NE(pub.metrics_text().find("kvserve_kv_events_batches_dropped_total " + std::to_string(refused)),
            std::string::npos);
}

TEST(KvEventPublisher, BindFailureNamesTheEndpoint) {
  events::PublisherOptions o = local_options();
  o.endpoint = "tcp://127.0.0.1:notaport";
  try {
    events::EventPublisher pub(o);
    FAIL() << "bound a bad endpoint";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tcp://127.0.0.1:notaport"), std::string::npos) << e.what();
  }
}

TEST(ServeKvEvents, EveryEventOfARealServerDecodes) {
  if (!test::shared_available()) GTEST_SKIP() << "needs ../shared";
  if (!python_available()) GTEST_SKIP() << "needs /usr/bin/python3 with zmq and msgpack (scripts/deps.sh)";
  // A pool of nine 16-token blocks: distinct prompts soon evict each other.
  test::KvsProcess srv({"serve", "-m", test::shared("models/stories260K/stories260K.gguf"), "--port", "0",
                        "--threads", "1", "--max-seqs", "1", "-c", "128", "--max-request-share", "1", "--kv-headroom", "0", "--kv-events", "tcp://127.0.0.1:*",
                        "--kv-events-replay", "tcp://127.0.0.1:*", "--kv-events-tokens"},
                       "kvserve: kv events on");
  const int port = std::stoi(srv.find("listening on http://[0-9.]+:([0-9]+)"));
  const std::string pub = srv.find("kv events on (tcp://[0-9.:]+) ");
  const std::string replay = srv.find("replay (tcp://[0-9.:]+),");
  ASSERT_FALSE(pub.empty());
  ASSERT_FALSE(replay.empty());
  Subscriber sub("--pub " + pub + " --replay " + replay + " --block-size 16 --tokens --idle 2 --timeout 90");
  std::string why;
  ASSERT_TRUE(sub.ready(&why)) << why;
  const char* words[] = {"One day a little girl", "The sun was hot and", "A big dog ran to", "Tom had a red ball"};
  for (int i = 0; i < 4; ++i) {
    std::string prompt;
    for (int k = 0; k < 8; ++k) prompt += std::string(words[i]) + " ";
    const json body = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
    const test::HttpReply r = test::http_request(port, "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  }
  const json s = sub.summary();
  EXPECT_EQ(s["errors"], json::array()) << s.dump();
  EXPECT_GE(s["stored_blocks"].get<int>(), 8) << s.dump();
  EXPECT_GE(s["removed_blocks"].get<int>(), 1) << s.dump();  // the small pool evicted
  EXPECT_EQ(s["cleared"], 1);
  EXPECT_TRUE(s["parents_known"].get<bool>());
  EXPECT_GT(test::metric_value(port, "kvserve_kv_events_batches_published_total"), 1);
  EXPECT_EQ(srv.stop(), 0);
}
