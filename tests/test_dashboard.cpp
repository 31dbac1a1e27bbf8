// The dashboard's data path: the pool snapshot (states, ref counts, owners,
// aggregation), its cost at 100,000 blocks, the engine loop's pool view
// agreeing with its metrics, the JSON the page reads, and the event hub.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>
#include <vector>

#include "fake_executor.h"
#include "kv/kv_manager.h"
#include "kv/pool_snapshot.h"
#include "sched/engine_loop.h"
#include "server/dashboard.h"
#include "server/dashboard_hub.h"

namespace {

using namespace kvs;
using nlohmann::json;

std::vector<int32_t> tokens(int n, int32_t base) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), base);
  return t;
}

// A sequence of `n` tokens written into the pool (its full blocks keyed).
SeqId add_written(KvManager& kv, int n, int32_t base, const Scope& scope) {
  const auto t = tokens(n, base);
  const SeqAdmission a = kv.add_sequence(t, scope);
  const std::span<const int32_t> rest(t.data() + a.cached_tokens, t.size() - size_t(a.cached_tokens));
  EXPECT_TRUE(kv.reserve(a.seq, int(rest.size())));
  kv.commit(a.seq, rest);
  return a.seq;
}

int32_t sum(const std::vector<int32_t>& v) { return std::accumulate(v.begin(), v.end(), 0); }

TEST(PoolSnapshot, StatesRefCountsAndOwnersPerBlock) {
  KvManager kv(12, KvManagerOptions::basic(4, true));
  const Scope a = make_scope("model", "tenant-a"), b = make_scope("model", "tenant-b");
  const SeqId s1 = add_written(kv, 9, 100, a);  // 2 full keyed blocks + 1 partial
  const SeqId s2 = kv.fork(s1);                 // shares all three
  const SeqId s3 = add_written(kv, 8, 500, b);
  kv.release(s3);  // its two keyed blocks become cached
  (void)s2;
  const PoolCells c = snapshot_pool(kv, 100);
  ASSERT_EQ(c.group, 1);
  ASSERT_EQ(c.cells(), 12);
  EXPECT_EQ(c.total, 12);
  EXPECT_EQ(c.used, kv.pool().n_used());
  EXPECT_EQ(c.cached, kv.pool().n_cached());
  EXPECT_EQ(c.free, kv.pool().n_free());
  EXPECT_EQ(c.used + c.cached + c.free, c.total);
  EXPECT_EQ(sum(c.n_free), c.free);
  EXPECT_EQ(sum(c.n_cached), c.cached);
  EXPECT_EQ(sum(c.n_used), c.used);
  EXPECT_EQ(sum(c.n_shared), 3);  // every block of s1 is also s2's
  for (int32_t blk : kv.block_table(s1)) {
    EXPECT_EQ(c.max_ref[size_t(blk)], 2);
    ASSERT_GE(c.owner[size_t(blk)], 0);
    EXPECT_EQ(c.owners[size_t(c.owner[size_t(blk)])], owner_tag(a));
  }
  ASSERT_EQ(c.owners.size(), 2u);
  const size_t ib = c.owners[0] == owner_tag(b) ? 0 : 1;
  EXPECT_EQ(c.owners[ib], owner_tag(b));
  EXPECT_EQ(c.owner_cached[ib], 2);
  EXPECT_EQ(c.owner_used[1 - ib], 3);
  for (int32_t i = 0; i < c.cells(); ++i) {
    if (c.n_free[size_t(i)]) {
      EXPECT_EQ(c.owner[size_t(i)], -1);
    }
    EXPECT_EQ(c.max_ref[size_t(i)], kv.pool().ref_count(i)) << "block " << i;
    EXPECT_EQ(c.n_used[size_t(i)] == 1, kv.pool().state(i) == BlockState::Used);
    EXPECT_EQ(c.n_cached[size_t(i)] == 1, kv.pool().state(i) == BlockState::Cached);
  }
}

// A hybrid cache (a full table and a table of 8-token windows): every
// table's blocks have their owner, and each cell names the table it serves.
TEST(PoolSnapshot, HybridCellsNameTheirTable) {
  KvManagerOptions o = KvManagerOptions::basic(4, true);
  o.table_windows = {0, 8};
  KvManager kv(16, o);
  const Scope a = make_scope("model", "tenant-a");
  // Table 0: blocks 0..4; table 1: 5..9, of which 5..7 (keys 0..11) are
  // dead for the next query (13..20) and cached.
  const SeqId s = add_written(kv, 20, 100, a);
  EXPECT_EQ(kv.block_tables(s), (std::vector<std::vector<int32_t>>{{0, 1, 2, 3, 4}, {-1, -1, -1, 8, 9}}));
  const PoolCells c = snapshot_pool(kv, 100);
  EXPECT_EQ(c.n_tables, 2);
  EXPECT_EQ(c.table_used, (std::vector<int32_t>{5, 2}));
  EXPECT_EQ(c.table, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1}));
  for (int32_t blk : kv.block_table(s, 1))
    if (blk >= 0) {
      EXPECT_EQ(c.owners[size_t(c.owner[size_t(blk)])], owner_tag(a));
    }
  const json j = json::parse(server::pool_json(c, {"a"}, 4));
  EXPECT_EQ(j["tables"], 2);
  EXPECT_EQ(j["t"].size(), 16u);
  const KvManager plain(4, KvManagerOptions::basic(4, true));
  const json one = json::parse(server::pool_json(snapshot_pool(plain, 10), {}, 4));
  EXPECT_FALSE(one.contains("tables"));  // one table: the page's data as it was
}

TEST(PoolSnapshot, AggregatesAboveTheCellLimit) {
  KvManager kv(1000, KvManagerOptions::basic(4, true));
  const Scope a = make_scope("model", "a");
  add_written(kv, 4 * 300, 1, a);
  const PoolCells c = snapshot_pool(kv, 64);
  EXPECT_EQ(c.group, 16);  // ceil(1000 / 64)
  EXPECT_EQ(c.cells(), 63);
  EXPECT_EQ(sum(c.n_used), 300);
  EXPECT_EQ(sum(c.n_free) + sum(c.n_cached) + sum(c.n_used), 1000);
  EXPECT_EQ(c.n_free.back() + c.n_cached.back() + c.n_used.back(), 1000 - 62 * 16);
  EXPECT_THROW(snapshot_pool(kv, 0), std::invalid_argument);
}

// The number docs/SERVER.md quotes: one snapshot of a 100,000-block pool
// (aggregated to the dashboard's 4096 cells) and its JSON, on the engine
// thread. The bound here is loose (sanitizer and shared CI machines); the
// printed figures are the measurement.
TEST(PoolSnapshot, HundredThousandBlocksCostAndSize) {
  const int32_t n = 100000;
  KvManager kv(n, KvManagerOptions::basic(16, true));
  std::vector<SeqId> seqs;
  for (int i = 0; i < 600; ++i)
    seqs.push_back(add_written(kv, 16 * 100 + 5, 1000 * i, make_scope("model", "tenant" + std::to_string(i % 7))));
  for (size_t i = 0; i < seqs.size(); i += 2) kv.release(seqs[i]);  // half of it cached
  std::vector<std::string> owners;
  using ms_t = std::chrono::duration<double, std::milli>;
  auto run = [&](int32_t cells, size_t& bytes, double& snap_ms) {
    const auto t0 = std::chrono::steady_clock::now();
    const PoolCells c = snapshot_pool(kv, cells);
    snap_ms = ms_t(std::chrono::steady_clock::now() - t0).count();
    owners.assign(c.owners.size(), "0123456789abcdef");
    const std::string j = server::pool_json(c, owners, 16);
    bytes = j.size();
    return ms_t(std::chrono::steady_clock::now() - t0).count();
  };
  for (int32_t cells : {4096, n}) {
    std::vector<double> all, snap;
    size_t bytes = 0;
    for (int r = 0; r < 15; ++r) {
      double s = 0;
      all.push_back(run(cells, bytes, s));
      snap.push_back(s);
    }
    std::sort(all.begin(), all.end());
    std::sort(snap.begin(), snap.end());
    std::printf("%d blocks in <= %d cells: snapshot median %.3f ms (min %.3f), + JSON median %.3f ms (min %.3f), %zu bytes\n",
                n, cells, snap[snap.size() / 2], snap[0], all[all.size() / 2], all[0], bytes);
    if (cells == 4096) {
      EXPECT_LT(all[all.size() / 2], 25.0);
    }
  }
  const PoolCells c = snapshot_pool(kv, 4096);
  EXPECT_EQ(c.used + c.cached + c.free, n);
  EXPECT_EQ(c.owners.size(), 7u);
}

sched::EngineLoopOptions quiet_opts() {
  sched::EngineLoopOptions o;
  o.kv_blocks = 64;
  o.block_size = 16;
  o.max_ctx = 512;
  o.sched.max_request_share = 0.5;
  o.sched.tenant_quota_share = 1.0;
  o.sched.wait_limit_s = {1e6, 1e6};
  o.log = [](const std::string&) {};
  return o;
}

sched::Request request(const std::string& tenant, int prompt, int max_tokens) {
  sched::Request r;
  r.prompt = tokens(prompt, 1);
  for (auto& t : r.prompt) t %= 60;
  r.max_tokens = max_tokens;
  r.tenant = tenant;
  r.scope = make_scope("m", tenant);
  return r;
}

// The view's map and its metrics come from one instant; its owners name the
// tenant that submitted under each scope.
TEST(DashboardData, PoolViewAgreesWithMetricsAndNamesTenants) {
  sched::FakeExecutorOptions fo;
  fo.n_blocks = 64;
  sched::EngineLoop loop(std::make_unique<sched::FakeExecutor>(fo), nullptr, quiet_opts());
  ASSERT_TRUE(loop.submit(request("aaaa", 40, 8)).accepted);
  ASSERT_TRUE(loop.submit(request("bbbb", 50, 8)).accepted);
  EXPECT_FALSE(loop.submit(request("cccc", 400, 200)).accepted);  // over the request share
  loop.wait_idle();
  const auto v = loop.pool_view(4096, 10);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->cells.total, v->metrics.kv_blocks_total);
  EXPECT_EQ(v->cells.free, v->metrics.kv_blocks_free);
  EXPECT_EQ(v->cells.cached, v->metrics.kv_blocks_cached);
  EXPECT_EQ(v->cells.used, v->metrics.kv_blocks_used);
  EXPECT_GT(v->cells.cached, 0);
  std::vector<std::string> who = v->owner_tenants;
  std::sort(who.begin(), who.end());
  EXPECT_EQ(who, (std::vector<std::string>{"aaaa", "bbbb"}));
  ASSERT_EQ(v->metrics.recent_rejects.size(), 1u);
  EXPECT_EQ(v->metrics.recent_rejects[0].reason, sched::RejectReason::RequestShare);
  EXPECT_EQ(v->metrics.recent_rejects[0].tenant, "cccc");
  EXPECT_GT(v->metrics.recent_rejects[0].need_blocks, 32);
  loop.shutdown();
}

TEST(DashboardData, SnapshotJsonCarriesThePageFields) {
  sched::FakeExecutorOptions fo;
  fo.n_blocks = 64;
  sched::EngineLoop loop(std::make_unique<sched::FakeExecutor>(fo), nullptr, quiet_opts());
  ASSERT_TRUE(loop.submit(request("aaaa", 40, 8)).accepted);
  EXPECT_FALSE(loop.submit(request("cccc", 400, 200)).accepted);
  loop.wait_idle();
  server::DashboardOptions o;
  o.max_cells = 16;
  o.model_id = "fake";
  server::ServeDashboard d(loop, nullptr, nullptr, o);
  d.sample();
  const json j = json::parse(d.sample());
  const json& b = j["blocks"];
  EXPECT_EQ(b["free"].get<int64_t>() + b["used"].get<int64_t>() + b["cached"].get<int64_t>(), b["total"].get<int64_t>());
  EXPECT_EQ(j["pool"]["total"], b["total"]);
  EXPECT_EQ(j["pool"]["group"], 4);  // 64 blocks in 16 cells
  EXPECT_EQ(j["pool"]["f"].size(), 16u);
  EXPECT_EQ(j["pool"]["owners"], json::array({"aaaa"}));
  EXPECT_EQ(j["history"]["queued"].size(), 2u);
  EXPECT_EQ(j["admission"]["by_reason"]["request_share"], 1);
  EXPECT_EQ(j["admission"]["recent"][0]["tenant"], "cccc");
  EXPECT_TRUE(j["latency"].contains("interactive"));
  EXPECT_EQ(j["latency"]["interactive"]["requests"], 1);
  EXPECT_EQ(j["model"], "fake");
  // Tenants as given (hashes in the server), with what they hold.
  ASSERT_FALSE(j["tenants"].empty());
  EXPECT_EQ(j["tenants"][0]["tenant"], "aaaa");
  EXPECT_GT(j["tenants"][0]["cached_blocks"].get<int64_t>(), 0);
  loop.shutdown();
}

bool wait_until(const std::function<bool()>& f, double s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(s);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return f();
}

TEST(DashboardHub, LatestFirstThenEachPeriodAndStopEndsStreams) {
  std::atomic<int> n{0};
  server::DashboardHub hub([&] { return "{\"n\":" + std::to_string(++n) + "}"; }, 0.02);
  ASSERT_TRUE(wait_until([&] { return !hub.latest().empty(); }, 10));
  std::atomic<int> wakes{0};
  auto s = hub.subscribe([&] { ++wakes; });
  server::StreamOutput o = s->poll();
  EXPECT_TRUE(o.start_stream);
  EXPECT_EQ(o.data.rfind("data: {\"n\":", 0), 0u);
  EXPECT_FALSE(o.done);
  const int w = wakes;
  ASSERT_TRUE(wait_until([&] { return wakes > w + 1; }, 10));
  o = s->poll();
  EXPECT_FALSE(o.start_stream);
  EXPECT_NE(o.data.find("data: "), std::string::npos);
  hub.stop();
  EXPECT_TRUE(s->poll().done);
  EXPECT_TRUE(hub.subscribe(nullptr)->poll().done);  // after stop: ends at once
}

// A reader that does not keep up holds one event, the newest.
TEST(DashboardHub, SlowReaderHoldsOnlyTheNewestEvent) {
  std::atomic<int> n{0};
  server::DashboardHub hub([&] { return "{\"n\":" + std::to_string(++n) + "}"; }, 0.01);
  auto s = hub.subscribe(nullptr);
  s->poll();
  const int seen = n;
  ASSERT_TRUE(wait_until([&] { return n > seen + 5; }, 10));
  const std::string d = s->poll().data;
  size_t events = 0;
  for (size_t p = d.find("data: "); p != std::string::npos; p = d.find("data: ", p + 1)) ++events;
  EXPECT_EQ(events, 1u);
  s->client_gone();
  EXPECT_TRUE(s->poll().data.empty());
}

}  // namespace
