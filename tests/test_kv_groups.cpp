// The hybrid KV cache without a model: layer groups and their tables
// (kernels/kv_groups.h), what a table's window hides (TableWindow), the
// largest prefix hit every table allows (kv/prefix_hits.h), and KvManager
// with several block tables over one pool, with exact block ids per table:
// a windowed table recycles its blocks, a hit after the window slid reuses
// only what is valid, fork and copy-on-write per table, adoption; then
// random operations with every invariant checked after each one.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>

#include "kernels/kv_groups.h"
#include "kv/block_storage.h"
#include "kv/kv_manager.h"
#include "kv/prefix_chain.h"
#include "kv/prefix_hits.h"

using namespace kvs;
using V = std::vector<int32_t>;
using VV = std::vector<V>;

namespace {

TEST(KvGroups, GroupsByWindowFullTablesFirstPaddedLast) {
  // Gemma 2 shape: every other layer windowed.
  const KvGroups g2 = KvGroups::by_window({16, 0, 16, 0});
  EXPECT_EQ(g2.slots, 2);
  ASSERT_EQ(g2.n_tables(), 2);
  EXPECT_EQ(g2.tables[0].window, 0);
  EXPECT_EQ(g2.tables[0].layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(g2.tables[1].window, 16);
  EXPECT_EQ(g2.tables[1].layers, (std::vector<int>{0, 2}));
  EXPECT_EQ(g2.table_of, (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(g2.slot_of, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(g2.describe(), "2 tables x 2 slots: w0 {1,3} | w16 {0,2}");
  // Gemma 3 shape: five local layers per global one; S = 1, six tables.
  const KvGroups g3 = KvGroups::by_window({32, 32, 32, 32, 32, 0});
  EXPECT_EQ(g3.slots, 1);
  ASSERT_EQ(g3.n_tables(), 6);
  EXPECT_EQ(g3.tables[0].layers, (std::vector<int>{5}));
  for (int t = 1; t < 6; ++t) EXPECT_EQ(g3.tables[size_t(t)].layers, (std::vector<int>{t - 1}));
  // Three windowed layers over two slots: the last table is padded.
  const KvGroups pad = KvGroups::by_window({8, 0, 8, 0, 8});
  EXPECT_EQ(pad.describe(), "3 tables x 2 slots: w0 {1,3} | w8 {0,2} | w8 {4}");
  // Two windows and no full layer: the smaller window's table first.
  EXPECT_EQ(KvGroups::by_window({64, 8, 64, 8}).describe(), "2 tables x 2 slots: w8 {1,3} | w64 {0,2}");
  // One window for all: one table, slot = layer, as the cache always was.
  const KvGroups one = KvGroups::by_window({4096, 4096, 4096});
  EXPECT_FALSE(one.hybrid());
  EXPECT_EQ(one, KvGroups::uniform(3, 4096));
  EXPECT_EQ(one.slot_of, (std::vector<int>{0, 1, 2}));
  EXPECT_THROW(KvGroups::by_window({}), std::invalid_argument);
  EXPECT_THROW(KvGroups::by_window({8, -1}), std::invalid_argument);
}

TEST(KvGroups, LayoutAddressesSlotsAndKeepsOneTableIdentical) {
  KvLayout one{4, 2, 8, 16};
  KvLayout grouped = one;
  grouped.groups = KvGroups::by_window({16, 0, 16, 0});
  EXPECT_EQ(one.block_bytes(), 4 * one.layer_bytes());
  EXPECT_EQ(grouped.block_bytes(), 2 * one.layer_bytes());  // S = 2 layer slots per block
  EXPECT_EQ(grouped.n_tables(), 2);
  EXPECT_EQ(grouped.bytes_per_token(), one.bytes_per_token());  // no padding here
  EXPECT_EQ(grouped.residual_floats(), one.residual_floats());  // per model layer
  EXPECT_EQ(one.describe(), "f32");
  EXPECT_EQ(grouped.describe(), "f32; 2 tables x 2 slots: w0 {1,3} | w16 {0,2}");
  KvLayout uniform = one;
  uniform.groups = KvGroups::uniform(4);
  EXPECT_EQ(uniform.describe(), one.describe());
  EXPECT_EQ(uniform.block_bytes(), one.block_bytes());
  KvLayout bad = one;
  bad.groups = KvGroups::uniform(3);
  EXPECT_THROW(bad.validate(), std::invalid_argument);
}

TEST(TableWindow, LayerWindowOnTopOfThePolicy) {
  const TableWindow w8{WindowPolicy{}, 8};
  // Query p sees keys p-7 .. p: at p = 11 keys 0..3 are hidden, 4 is not.
  EXPECT_TRUE(w8.dead(0, 4, 11));
  EXPECT_FALSE(w8.dead(0, 5, 11));
  EXPECT_FALSE(w8.dead(0, 4, 10));
  EXPECT_FALSE(TableWindow{}.frees());
  EXPECT_FALSE(TableWindow{}.dead(0, 4, 1000));
  // Sinks + window policy and a layer window of 8: the policy keeps the
  // sinks, the layer window hides them once the query is 8 past them.
  const TableWindow both{WindowPolicy::streaming(16, 2), 8};
  EXPECT_TRUE(both.dead(4, 8, 22));   // [2, 7) hidden by the policy at p = 22 ∪ [0, 15) by the layer
  EXPECT_TRUE(both.dead(0, 2, 12));   // sinks hidden by the layer window (p - 7 = 5 > 2)
  EXPECT_FALSE(both.dead(0, 2, 8));   // p = 8 still sees key 1
  EXPECT_TRUE(both.dead(8, 12, 20));  // [2, 5) policy ∪ [0, 13) layer
  EXPECT_FALSE(both.dead(12, 16, 20));
  EXPECT_EQ(both.block_cap(4, 4), window_block_cap(WindowPolicy::native(8), 4, 4));
  EXPECT_EQ(w8.block_cap(4, 16), 2 + 2 + 4);
  EXPECT_EQ(TableWindow{}.block_cap(4, 16), INT64_MAX);
}

TEST(PrefixHits, LargestHitEveryTableAllows) {
  const std::vector<TableWindow> tw = {TableWindow{}, TableWindow{WindowPolicy{}, 8}};
  // Six blocks of 4: the full table has all, the windowed one lacks block 2.
  const std::vector<std::vector<uint8_t>> avail = {{1, 1, 1, 1, 1, 1}, {1, 1, 0, 1, 1, 1}};
  // h = 6 (26-token prompt, 24 cached): the query at 24 sees keys 17..24,
  // blocks 4, 5: the hole in block 2 does not matter.
  EXPECT_EQ(largest_hit(tw, avail, 26, 4, 1), 6);
  EXPECT_FALSE(hit_needs_block(tw[1], 3, 24, 4));
  EXPECT_TRUE(hit_needs_block(tw[1], 4, 24, 4));
  EXPECT_TRUE(hit_needs_block(tw[0], 0, 24, 4));
  // A 14-token prompt walks three blocks: h = 3 (12 cached) needs windowed
  // blocks 1, 2 (keys 5..12): block 2 is missing; h = 2 needs blocks 0, 1.
  const std::vector<std::vector<uint8_t>> three = {{1, 1, 1}, {1, 1, 0}};
  EXPECT_EQ(largest_hit(tw, three, 14, 4, 1), 2);
  // Fully cached 12-token prompt: 11 cached, the query at 11 sees 4..11.
  EXPECT_EQ(cached_tokens_for_hit(3, 12, 4, 1), 11);
  EXPECT_EQ(cached_tokens_for_hit(3, 12, 4, 4), 8);  // quantized: back to a group boundary
  EXPECT_EQ(largest_hit(tw, {{1, 1, 1}, {0, 1, 1}}, 12, 4, 1), 3);
  EXPECT_EQ(largest_hit(tw, {{1, 1, 1}, {1, 0, 1}}, 12, 4, 1), 1);
  // The full table's first miss bounds every hit.
  EXPECT_EQ(largest_hit(tw, {{1, 0, 1}, {1, 1, 1}}, 14, 4, 1), 1);
}

// A model-free pool with tables {full, window 8}, blocks of 4 slots.
KvManagerOptions two_tables(bool caching, int window = 8) {
  KvManagerOptions o = KvManagerOptions::basic(4, caching);
  o.table_windows = {0, window};
  o.max_step_tokens = 4;
  return o;
}

V iota_tokens(int n, int from = 1) {
  V t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), from);
  return t;
}

void step(KvManager& m, SeqId s, const V& toks) {
  ASSERT_TRUE(m.reserve(s, int(toks.size())));
  m.commit(s, toks);
  m.check_invariants(true);
}

TEST(HybridKvManager, WindowedTableRecyclesItsBlocks) {
  KvManager m(64, two_tables(false));
  EXPECT_EQ(m.n_tables(), 2);
  const SeqAdmission a = m.add_sequence(V{1}, {});
  // One token at a time. Each new logical block takes a block for table 0,
  // then one for table 1, from the free stack (the most recently freed
  // first). Table 1's logical block 0 (keys 0..3) dies once the next query
  // is at 11 (it sees 4..11), so after the 11th token: physical 1 is free
  // and the next allocation (table 0's logical block 3, at token 12) takes it.
  for (int i = 0; i < 11; ++i) step(m, a.seq, V{i});
  EXPECT_EQ(m.block_tables(a.seq), (VV{{0, 2, 4}, {-1, 3, 5}}));
  step(m, a.seq, V{11});
  step(m, a.seq, V{12});
  EXPECT_EQ(m.block_tables(a.seq), (VV{{0, 2, 4, 1}, {-1, 3, 5, 6}}));
  // Logical block 1 of table 1 dies after token 14 (query 15 sees 8..15),
  // logical block 2 after token 18: they come back as table 0's blocks 4, 5.
  for (int i = 13; i < 21; ++i) step(m, a.seq, V{i});
  EXPECT_EQ(m.block_tables(a.seq), (VV{{0, 2, 4, 1, 3, 5}, {-1, -1, -1, 6, 7, 8}}));
  // Table 1 holds at most ceil(8 / 4) + 1 blocks, however long the sequence grows.
  for (int i = 21; i < 200; ++i) {
    step(m, a.seq, V{i});
    int held = 0;
    for (int32_t b : m.block_table(a.seq, 1)) held += b >= 0;
    ASSERT_LE(held, 3) << i;
  }
  // 200 tokens: the query at 200 sees 193..200, so table 1 holds logical
  // blocks 48 and 49 only.
  EXPECT_EQ(m.stats().table_blocks, (std::vector<int64_t>{50, 2}));
  EXPECT_EQ(m.stats().used_blocks, 52);
  EXPECT_EQ(m.seq_info(a.seq).blocks, 52);
  // Caps and the scheduler's arithmetic, per table and summed.
  EXPECT_EQ(m.table_cap(0), INT64_MAX);
  EXPECT_EQ(m.table_cap(1), 2 + 2 + 1);  // window_block_cap(native 8, 4, one step of 4)
  EXPECT_EQ(m.live_cap(), INT64_MAX);
  EXPECT_EQ(m.bounded(100), 100 + 5);
  EXPECT_EQ(m.bounded(3), 3 + 3);
  EXPECT_EQ(m.bounded(100, 2), 100 + 10);
  // 100 more tokens: table 0 takes 25 blocks, table 1 at most 5 - 2 more.
  EXPECT_EQ(m.horizon_blocks(a.seq, 300), 25 + 3);
  EXPECT_EQ(m.blocks_needed(a.seq, 1), 2);  // 200 tokens fill 50 blocks: one new block per table
  m.release(a.seq);
  EXPECT_EQ(m.pool().n_used(), 0);
}

// Sequence A computes 24 tokens (6 blocks) in one step and is released:
// table 0 = blocks 0..5, table 1 = 6..11; table 1's blocks 0..3 died at the
// commit (the query at 24 sees 17..24) and went to the LRU newest first.
std::unique_ptr<KvManager> computed_and_released(int32_t n_blocks, const Scope& sc) {
  auto mp = std::make_unique<KvManager>(n_blocks, two_tables(true), nullptr);
  KvManager& m = *mp;
  const SeqAdmission a = m.add_sequence(iota_tokens(24), sc);
  EXPECT_TRUE(m.reserve(a.seq, 24));
  m.commit(a.seq, iota_tokens(24));
  EXPECT_EQ(m.block_tables(a.seq), (VV{{0, 1, 2, 3, 4, 5}, {-1, -1, -1, -1, 10, 11}}));
  m.check_invariants(true);
  m.release(a.seq);  // tail first, both tables
  EXPECT_EQ(m.pool().lru_order(), (V{9, 8, 7, 6, 5, 11, 4, 10, 3, 2, 1, 0}));
  return mp;
}

TEST(HybridKvManager, HitTakesOnlyTheBlocksTheWindowSees) {
  const Scope sc = make_scope("m", "t");
  const auto mp = computed_and_released(16, sc);
  KvManager& m = *mp;
  // The table keys: table 0 the chain keys, table 1 derived from them.
  const std::vector<BlockKey> chain = m.chain_keys(iota_tokens(24), sc);
  EXPECT_EQ(m.pool().lookup(chain[2]), 2);
  EXPECT_EQ(m.pool().lookup(table_key(chain[2], 1)), 8);
  EXPECT_NE(table_key(chain[2], 1), chain[2]);
  EXPECT_EQ(m.table_keys(iota_tokens(8), sc), (std::vector<BlockKey>{chain[0], table_key(chain[0], 1), chain[1],
                                                                     table_key(chain[1], 1)}));
  // 26 tokens: 24 cached. Table 1 needs only blocks 4, 5 (keys 17..24).
  V p26 = iota_tokens(24);
  p26.push_back(100);
  p26.push_back(101);
  const KvManager::PrefixProbe pr = m.probe_prefix(p26, sc);
  EXPECT_EQ(pr.hits, 6);
  EXPECT_EQ(pr.revived, 6 + 2);
  const SeqAdmission b = m.add_sequence(p26, sc);
  EXPECT_EQ(b.cached_tokens, 24);
  EXPECT_EQ(m.block_tables(b.seq), (VV{{0, 1, 2, 3, 4, 5}, {-1, -1, -1, -1, 10, 11}}));
  m.check_invariants(true);
  // Fresh blocks 12, 13 from the free list; the query at 26 still sees key 19.
  step(m, b.seq, V{100, 101});
  EXPECT_EQ(m.block_tables(b.seq), (VV{{0, 1, 2, 3, 4, 5, 12}, {-1, -1, -1, -1, 10, 11, 13}}));
  m.release(b.seq);
  // A fully cached prompt (exactly 24 tokens): 23 cached, the query at 23
  // sees 16..23, so table 1 keeps blocks 4 and 5; the next reserve copies
  // block 5 in both tables (keyed) and one token goes through the model.
  const SeqAdmission c = m.add_sequence(iota_tokens(24), sc);
  EXPECT_EQ(c.cached_tokens, 23);
  EXPECT_EQ(m.block_tables(c.seq), (VV{{0, 1, 2, 3, 4, 5}, {-1, -1, -1, -1, 10, 11}}));
  EXPECT_EQ(m.blocks_needed(c.seq, 1), 2);
  step(m, c.seq, V{24});
  EXPECT_EQ(m.block_tables(c.seq), (VV{{0, 1, 2, 3, 4, 13}, {-1, -1, -1, -1, 10, 12}}));
  EXPECT_EQ(m.stats().cow_copies, 2);
  m.release(c.seq);
}

TEST(HybridKvManager, HitAfterTheWindowSlidReusesOnlyWhatIsValid) {
  const Scope sc = make_scope("m", "t");
  const auto mp = computed_and_released(12, sc);  // every block cached, none free
  KvManager& m = *mp;
  // Another sequence takes two blocks: the LRU's first two, table 1's
  // logical blocks 3 and 2 (physical 9, 8), are evicted.
  const SeqAdmission d = m.add_sequence(V{77}, make_scope("m", "other"));
  step(m, d.seq, V{77});
  EXPECT_EQ(m.block_tables(d.seq), (VV{{9}, {8}}));
  // 13 tokens sharing A's first 12: table 0 has blocks 0..2, but a hit of
  // three blocks (12 cached, query at 12 sees 5..12) needs table 1's
  // logical block 2, which is gone. Two blocks (8 cached, query at 8 sees
  // 1..8) need table 1's blocks 0 and 1: still cached. So 8 tokens hit and
  // tokens 8..12 are recomputed.
  V p13 = iota_tokens(12);
  p13.push_back(200);
  EXPECT_EQ(m.cached_prefix_blocks(p13, sc), 2);
  const SeqAdmission c = m.add_sequence(p13, sc);
  EXPECT_EQ(c.cached_tokens, 8);
  EXPECT_EQ(m.block_tables(c.seq), (VV{{0, 1}, {6, 7}}));
  m.check_invariants(true);
  // Recomputing logical block 2: table 0's cached block 2 still holds its
  // key, so the recomputed copy stays unkeyed (the first copy keeps the
  // key); table 1's copy of it is keyed afresh (its old one was evicted).
  step(m, c.seq, V(p13.begin() + 8, p13.end()));
  const std::vector<BlockKey> chain = m.chain_keys(p13, sc);
  // New blocks come from the LRU (nothing is free): 5, 11 for table 0,
  // 4, 10 for table 1; at 13 tokens table 1's block 0 (physical 6) is dead.
  EXPECT_EQ(m.block_tables(c.seq), (VV{{0, 1, 5, 11}, {-1, 7, 4, 10}}));
  EXPECT_EQ(m.pool().lookup(table_key(chain[2], 1)), m.block_table(c.seq, 1)[2]);
  EXPECT_EQ(m.pool().lookup(chain[2]), 2);
  m.release(c.seq);
  m.release(d.seq);
  m.check_invariants(true);
}

TEST(HybridKvManager, ForkAndCopyOnWritePerTable) {
  KvManager m(16, two_tables(true));
  const Scope sc = make_scope("m", "t");
  const SeqAdmission a = m.add_sequence(iota_tokens(6), sc);
  step(m, a.seq, iota_tokens(6));  // one step: table 0 takes its two blocks, then table 1
  EXPECT_EQ(m.block_tables(a.seq), (VV{{0, 1}, {2, 3}}));
  const SeqId f = m.fork(a.seq);
  EXPECT_EQ(m.block_tables(f), m.block_tables(a.seq));
  EXPECT_EQ(m.pool().ref_count(1), 2);
  EXPECT_EQ(m.pool().ref_count(3), 2);
  EXPECT_EQ(m.blocks_needed(f, 1), 2);  // the shared partial block, in each table
  step(m, f, V{50});
  EXPECT_EQ(m.block_tables(f), (VV{{0, 4}, {2, 5}}));
  EXPECT_EQ(m.stats().cow_copies, 2);
  step(m, a.seq, V{60});  // the parent now owns blocks 1, 3 alone: no copy
  EXPECT_EQ(m.block_tables(a.seq), (VV{{0, 1}, {2, 3}}));
  EXPECT_EQ(m.exclusive_blocks(a.seq), 2);
  EXPECT_EQ(m.exclusive_blocks(f), 2);
  // Past the window, each sequence frees its own table-1 entries; the
  // shared block 2 goes back to the pool only when both have let it go.
  for (int i = 0; i < 6; ++i) step(m, a.seq, V{70 + i});
  EXPECT_EQ(m.block_table(a.seq, 1)[0], -1);
  EXPECT_EQ(m.pool().ref_count(2), 1);
  for (int i = 0; i < 6; ++i) step(m, f, V{80 + i});
  EXPECT_EQ(m.pool().state(2), BlockState::Cached);  // keyed (full): the LRU keeps it
  m.release(a.seq);
  m.release(f);
  EXPECT_EQ(m.pool().n_used(), 0);
  m.check_invariants(true);
}

TEST(HybridKvManager, AdoptionReservesWhatEachTableNeeds) {
  const Scope sc = make_scope("m", "t");
  const auto mp = computed_and_released(32, sc);
  KvManager& m = *mp;
  // 22 tokens, of which A's first 20 are cached in both tables where the
  // next query (at 22, seeing 15..22) needs them: blocks 0..4 are hits (no
  // table needs table 1's 0..2; its 3 and 4 are cached), block 5 is fresh.
  V p22 = iota_tokens(20);
  p22.push_back(300);
  p22.push_back(301);
  const KvManager::Adoption ad = m.reserve_adoption(p22, sc);
  ASSERT_GE(ad.seq, 0);
  EXPECT_EQ(ad.hit_blocks, 5);
  EXPECT_EQ(ad.blocks, 6);
  EXPECT_EQ(ad.fresh, (std::vector<std::pair<int32_t, int32_t>>{{0, 5}, {1, 5}}));
  EXPECT_EQ(m.block_tables(ad.seq), (VV{{0, 1, 2, 3, 4, 12}, {-1, -1, -1, 9, 10, 13}}));
  m.check_invariants(true);
  m.finish_adoption(ad.seq, p22);
  EXPECT_EQ(m.num_tokens(ad.seq), 22);
  EXPECT_EQ(m.block_tables(ad.seq), (VV{{0, 1, 2, 3, 4, 12}, {-1, -1, -1, 9, 10, 13}}));
  step(m, ad.seq, V{302});  // the query at 23 no longer sees key 15: table 1's block 3 goes
  EXPECT_EQ(m.block_tables(ad.seq), (VV{{0, 1, 2, 3, 4, 12}, {-1, -1, -1, -1, 10, 13}}));
  m.check_invariants(true);
  m.release(ad.seq);
}

// Stored events and the tier's keyed hook name each table's physical block
// under its table key (table 0: the chain key), with the parent in the same
// table; a lower tier's blocks come back into each table's fresh blocks.
struct MapImporter final : BlockImporter {
  std::map<BlockKey, int> have;
  std::vector<std::pair<int32_t, int>> filled;
  bool ready(const BlockKey& k) override { return have.count(k) != 0; }
  bool fill(const BlockKey& k, int32_t b) override {
    filled.push_back({b, have.at(k)});
    return true;
  }
};

TEST(HybridKvManager, EventsHookAndTierImportsPerTable) {
  const Scope sc = make_scope("m", "t");
  KvManager m(32, two_tables(true));
  KvEventLog log;
  m.set_event_log(&log);
  // What a tier is offered: block, key, and the chain's previous block in
  // the same table (zero for a chain's first).
  using Offer = std::tuple<int32_t, BlockKey, BlockKey>;
  std::vector<Offer> offered;
  m.set_keyed_hook(
      [](void* ctx, int32_t b, const BlockKey& k, const BlockKey* parent, const Scope&) {
        static_cast<std::vector<Offer>*>(ctx)->push_back({b, k, parent ? *parent : BlockKey{}});
      },
      &offered);
  const SeqAdmission a = m.add_sequence(iota_tokens(8), sc);
  step(m, a.seq, iota_tokens(8));
  EXPECT_EQ(m.block_tables(a.seq), (VV{{0, 1}, {2, 3}}));
  const std::vector<BlockKey> c = m.chain_keys(iota_tokens(8), sc);
  const BlockKey d0 = table_key(c[0], 1), d1 = table_key(c[1], 1);
  ASSERT_EQ(log.events.size(), 4u);
  const std::vector<std::tuple<int32_t, int32_t, BlockKey>> want = {{0, 0, c[0]}, {2, 1, d0}, {1, 0, c[1]}, {3, 1, d1}};
  for (size_t i = 0; i < 4; ++i) {
    const KvEvent& e = log.events[i];
    EXPECT_EQ(e.kind, KvEvent::Kind::Stored);
    EXPECT_EQ(e.block, std::get<0>(want[i])) << i;
    EXPECT_EQ(e.table, std::get<1>(want[i])) << i;
    EXPECT_EQ(e.key, std::get<2>(want[i])) << i;
    EXPECT_EQ(e.has_parent, i >= 2) << i;
  }
  EXPECT_EQ(log.events[2].parent, c[0]);
  EXPECT_EQ(log.events[3].parent, d0);
  EXPECT_EQ(offered, (std::vector<Offer>{{0, c[0], {}}, {2, d0, {}}, {1, c[1], c[0]}, {3, d1, d0}}));
  // Another pool whose RAM has none of them imports every table's blocks
  // (9 tokens, 8 cached: the query at 8 sees keys 1..8, so both tables need
  // both blocks), block by block, table by table, into fresh blocks.
  KvManager m2(32, two_tables(true));
  MapImporter imp;
  imp.have = {{c[0], 10}, {d0, 11}, {c[1], 20}, {d1, 21}};
  V p9 = iota_tokens(8);
  p9.push_back(9);
  const SeqAdmission b = m2.add_sequence(p9, sc, &imp);
  EXPECT_EQ(b.cached_tokens, 8);
  EXPECT_EQ(b.imported_tokens, 8);
  EXPECT_EQ(m2.block_tables(b.seq), (VV{{0, 2}, {1, 3}}));
  EXPECT_EQ(imp.filled, (std::vector<std::pair<int32_t, int>>{{0, 10}, {1, 11}, {2, 20}, {3, 21}}));
  EXPECT_EQ(m2.stats().imported_blocks, 4);
  m2.check_invariants(true);
  // Without table 1's second block there is no 8-token hit; 4 tokens hit
  // (the query at 4 sees 0..4: both tables' block 0).
  KvManager m3(32, two_tables(true));
  MapImporter part;
  part.have = {{c[0], 10}, {d0, 11}, {c[1], 20}};
  const SeqAdmission h = m3.add_sequence(p9, sc, &part);
  EXPECT_EQ(h.cached_tokens, 4);
  EXPECT_EQ(m3.block_tables(h.seq), (VV{{0}, {1}}));
  m3.check_invariants(true);
}

// One float per slot and layer slot, one layer per table: "K/V" of a token
// is its id, written into each table's block, so every sequence can be
// checked to read back its own tokens wherever its tables' windows show them.
struct Harness {
  Harness(int32_t n_blocks, const std::vector<int>& windows, bool caching)
      : storage(layout(windows), n_blocks), m(n_blocks, options(windows, caching), &storage) {}
  static KvLayout layout(const std::vector<int>& windows) {
    KvLayout l{int(windows.size()), 1, 1, 4};
    l.groups = KvGroups::by_window(windows);
    return l;
  }
  static KvManagerOptions options(const std::vector<int>& windows, bool caching) {
    KvManagerOptions o = KvManagerOptions::basic(4, caching);
    o.table_windows = KvGroups::by_window(windows).table_windows();
    o.max_step_tokens = 8;
    return o;
  }
  bool append(SeqId s, const V& toks) {
    if (!m.reserve(s, int(toks.size()))) return false;
    for (int t = 0; t < m.n_tables(); ++t) {
      const V& table = m.block_table(s, t);
      int p = m.num_tokens(s);
      for (int32_t tok : toks) {
        const int32_t b = table[size_t(p / 4)];
        if (m.pool().ref_count(b) != 1 || m.pool().has_key(b)) throw std::logic_error("writing a shared block");
        *storage.view().k(b, 0, p % 4) = float(tok);
        ++p;
      }
    }
    m.commit(s, toks);
    return true;
  }
  void expect_reads_own_tokens(SeqId s) const {
    const V& toks = m.tokens(s);
    for (int t = 0; t < m.n_tables(); ++t) {
      const V& table = m.block_table(s, t);
      for (size_t p = 0; p < toks.size(); ++p) {
        if (table[p / 4] < 0) continue;  // hidden by the window (check_invariants: only then)
        ASSERT_EQ(*storage.view().k(table[p / 4], 0, int(p % 4)), float(toks[p]))
            << "sequence " << s << " table " << t << " position " << p;
      }
    }
  }
  BlockStorage storage;
  KvManager m;
};

TEST(HybridKvManager, RandomizedStressThreeTables) {
  const std::vector<int> windows = {0, 6, 10};  // three groups, one layer each
  Harness h(64, windows, true);
  KvManager& m = h.m;
  ASSERT_EQ(m.n_tables(), 3);
  std::mt19937_64 rng(4242);
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const Scope sc = make_scope("m", "a");
  std::map<SeqId, V> shadow;
  int64_t hits = 0, failures = 0;
  auto tokens = [&](int n) {
    V t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[size_t(i)] = (i < 16 && rnd(0, 4)) ? i % 3 : rnd(0, 2);
    return t;
  };
  for (int op = 0; op < 30000; ++op) {
    const int kind = rnd(0, 99);
    if (kind < 20 && shadow.size() < 12) {
      const V prompt = tokens(rnd(1, 40));
      const SeqAdmission a = m.add_sequence(prompt, sc);
      hits += a.cached_tokens;
      shadow[a.seq] = V(prompt.begin(), prompt.begin() + a.cached_tokens);
      h.expect_reads_own_tokens(a.seq);
      if (h.append(a.seq, V(prompt.begin() + a.cached_tokens, prompt.end()))) shadow[a.seq] = prompt;
      else ++failures;
    } else if (kind < 65 && !shadow.empty()) {
      auto it = shadow.begin();
      std::advance(it, rnd(0, int(shadow.size()) - 1));
      const V t = tokens(rnd(1, 8));
      if (h.append(it->first, t)) it->second.insert(it->second.end(), t.begin(), t.end());
      else ++failures;
    } else if (kind < 75 && !shadow.empty()) {
      const SeqId c = m.fork(shadow.begin()->first);
      shadow[c] = m.tokens(c);
    } else if (kind < 98 && !shadow.empty()) {
      auto it = shadow.begin();
      std::advance(it, rnd(0, int(shadow.size()) - 1));
      m.release(it->first);
      shadow.erase(it);
    } else {
      m.drop_cached();
    }
    ASSERT_NO_THROW(m.check_invariants(op % 500 == 0)) << "after operation " << op;
    if (op % 53 == 0)
      for (const auto& [s, toks] : shadow) h.expect_reads_own_tokens(s);
    // No sequence ever holds more of a windowed table than its cap.
    for (const auto& [s, toks] : shadow)
      for (int t = 1; t < 3; ++t) {
        int64_t held = 0;
        for (int32_t b : m.block_table(s, t)) held += b >= 0;
        ASSERT_LE(held, m.table_cap(t));
      }
  }
  for (const auto& [s, toks] : shadow) m.release(s);
  m.check_invariants(true);
  EXPECT_EQ(m.pool().n_used(), 0);
  std::printf("three tables: %lld hit tokens, %lld failed reserves, %lld evictions, %lld copies\n", (long long)hits,
              (long long)failures, (long long)m.stats().evictions, (long long)m.stats().cow_copies);
  EXPECT_GT(hits, 1000);
  EXPECT_GT(failures, 10);
  EXPECT_GT(m.stats().evictions, 100);
  EXPECT_GT(m.stats().cow_copies, 100);
}

}  // namespace
