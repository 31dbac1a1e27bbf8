// The KV manager's event hook: which blocks are reported Stored (keyed into
// the prefix index, with their chain parent and, on request, their tokens)
// and Removed (evicted for reuse, dropped by a revoke, a retention sweep or a
// cold-cache request), named by block id, in the order they happen.
#include <gtest/gtest.h>

#include <numeric>

#include "kv/kv_events.h"
#include "kv/kv_manager.h"

using namespace kvs;
using V = std::vector<int32_t>;

namespace {

constexpr int kBs = 4;

V iota(int n, int from) {
  V v(size_t(n), 0);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Prefill `prompt` for a new sequence (no model: bookkeeping only).
SeqId prefill(KvManager& kv, const V& prompt, const Scope& scope) {
  const SeqAdmission a = kv.add_sequence(prompt, scope);
  const int n = int(prompt.size()) - a.cached_tokens;
  EXPECT_TRUE(kv.reserve(a.seq, n));
  kv.commit(a.seq, std::span<const int32_t>(prompt).subspan(size_t(a.cached_tokens)));
  return a.seq;
}

std::vector<int32_t> blocks_of(const std::vector<KvEvent>& ev, KvEvent::Kind k) {
  std::vector<int32_t> out;
  for (const KvEvent& e : ev)
    if (e.kind == k) out.push_back(e.block);
  return out;
}

}  // namespace

TEST(KvEvents, StoredBlocksCarryChainParentsAndTokens) {
  KvManager kv(8, KvManagerOptions::basic(kBs, true));
  KvEventLog log;
  log.tokens = true;
  kv.set_event_log(&log);
  const Scope sc = make_scope("model");
  const V prompt = iota(10, 100);  // two full blocks and two tokens
  const SeqId s = prefill(kv, prompt, sc);
  ASSERT_EQ(log.events.size(), 2u);
  const KvEvent& a = log.events[0];
  const KvEvent& b = log.events[1];
  EXPECT_EQ(a.kind, KvEvent::Kind::Stored);
  EXPECT_EQ(a.block, kv.block_table(s)[0]);
  EXPECT_EQ(b.block, kv.block_table(s)[1]);
  EXPECT_FALSE(a.has_parent);
  EXPECT_TRUE(b.has_parent);
  EXPECT_EQ(b.parent, a.key);
  EXPECT_EQ(a.key, block_key(nullptr, prompt.data(), kBs, sc));
  EXPECT_EQ(b.key, block_key(&a.key, prompt.data() + kBs, kBs, sc));
  EXPECT_EQ(a.tokens, V({100, 101, 102, 103}));
  EXPECT_EQ(b.tokens, V({104, 105, 106, 107}));

  // Decoding two more tokens fills the third block: one more Stored event.
  log.events.clear();
  ASSERT_TRUE(kv.reserve(s, 2));
  kv.commit(s, V({110, 111}));
  ASSERT_EQ(log.events.size(), 1u);
  EXPECT_EQ(log.events[0].block, kv.block_table(s)[2]);
  EXPECT_EQ(log.events[0].parent, b.key);
  EXPECT_EQ(log.events[0].tokens, V({108, 109, 110, 111}));
}

TEST(KvEvents, TokensOnlyWhenAskedAndHitsStoreNothing) {
  KvManager kv(8, KvManagerOptions::basic(kBs, true));
  KvEventLog log;  // tokens off
  kv.set_event_log(&log);
  const Scope sc = make_scope("model");
  const SeqId s = prefill(kv, iota(9, 1), sc);
  ASSERT_EQ(log.events.size(), 2u);
  EXPECT_TRUE(log.events[0].tokens.empty());
  kv.release(s);
  // A second sequence hits both blocks: nothing is keyed anew.
  log.events.clear();
  const SeqId t = prefill(kv, iota(9, 1), sc);
  EXPECT_TRUE(log.events.empty());
  kv.release(t);
  kv.check_invariants();
}

TEST(KvEvents, EvictionNamesTheVictimBlocks) {
  // Six blocks: a 2-block prefix is cached, then a sequence needs all six,
  // so the cached blocks are evicted (LRU head first: the chain's tail was
  // released first, so it goes first).
  KvManager kv(6, KvManagerOptions::basic(kBs, true));
  KvEventLog log;
  kv.set_event_log(&log);
  const Scope sc = make_scope("model");
  const SeqId s = prefill(kv, iota(9, 1), sc);
  const V cached = {kv.block_table(s)[0], kv.block_table(s)[1]};
  EXPECT_EQ(blocks_of(log.events, KvEvent::Kind::Stored), cached);
  kv.release(s);
  log.events.clear();
  const SeqId big = prefill(kv, iota(21, 500), sc);  // 6 blocks, no hit
  const V removed = blocks_of(log.events, KvEvent::Kind::Removed);
  EXPECT_EQ(removed, V({cached[1], cached[0]}));
  // Removed events come before the new blocks' Stored events of that step.
  ASSERT_EQ(log.events.front().kind, KvEvent::Kind::Removed);
  EXPECT_EQ(blocks_of(log.events, KvEvent::Kind::Stored).size(), 5u);
  kv.release(big);
  kv.check_invariants();
}

TEST(KvEvents, RevokeRetentionAndColdCacheDropsAreRemoved) {
  KvManager kv(16, KvManagerOptions::basic(kBs, true));
  KvEventLog log;
  kv.set_event_log(&log);
  const Scope a = make_scope("model", "tenant-a"), b = make_scope("model", "tenant-b");
  kv.set_tick(10);
  const SeqId sa = prefill(kv, iota(9, 1), a);
  const V a_blocks = {kv.block_table(sa)[0], kv.block_table(sa)[1]};
  kv.release(sa);
  const SeqId held = prefill(kv, iota(5, 50), a);  // one keyed block of scope a still in use
  const int32_t held_block = kv.block_table(held)[0];
  kv.set_tick(20);
  const SeqId sb = prefill(kv, iota(9, 1), b);
  const V b_blocks = {kv.block_table(sb)[0], kv.block_table(sb)[1]};
  kv.release(sb);

  // Revoke of scope a: its cached blocks and the held block's key go.
  log.events.clear();
  EXPECT_EQ(kv.drop_cached_scope(a), 2);
  V removed = blocks_of(log.events, KvEvent::Kind::Removed);
  std::sort(removed.begin(), removed.end());
  V want = {a_blocks[0], a_blocks[1], held_block};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(removed, want);
  EXPECT_EQ(log.events.size(), 3u);

  // Retention: scope b's blocks last used at tick 20 < cutoff 25.
  log.events.clear();
  EXPECT_EQ(kv.drop_cached_older_than(b, 25), 2);
  removed = blocks_of(log.events, KvEvent::Kind::Removed);
  std::sort(removed.begin(), removed.end());
  want = b_blocks;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(removed, want);

  // Cold cache: everything cached leaves.
  kv.release(held);  // unkeyed by the revoke: goes free, no event
  const SeqId sc = prefill(kv, iota(5, 70), b);
  const int32_t c_block = kv.block_table(sc)[0];
  kv.release(sc);
  log.events.clear();
  kv.drop_cached();
  EXPECT_EQ(blocks_of(log.events, KvEvent::Kind::Removed), V({c_block}));
  kv.check_invariants();
}

TEST(KvEvents, DetachedLogRecordsNothing) {
  KvManager kv(8, KvManagerOptions::basic(kBs, true));
  KvEventLog log;
  kv.set_event_log(&log);
  kv.set_event_log(nullptr);
  prefill(kv, iota(9, 1), make_scope("model"));
  EXPECT_TRUE(log.events.empty());
}
