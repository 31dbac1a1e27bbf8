// Block pool and KV manager without a model: scripted scenarios with exact
// block ids, ref counts and eviction order, then 100k random operations with
// every invariant checked after each one. A tiny BlockStorage (one float per
// slot) stands in for the KV memory: "writing K/V" stores the token id in its
// slot, so every check can also ask "does each sequence read back exactly its
// own tokens through its block table?".
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>

#include "kv/block_pool.h"
#include "kv/block_storage.h"
#include "kv/kv_manager.h"

using namespace kvs;
using V = std::vector<int32_t>;

namespace {

BlockKey key_of(uint8_t x) {
  BlockKey k{};
  k[0] = x;
  k[31] = 0xAB;
  return k;
}

TEST(BlockPool, AllocateFreeLruAndEvictionOrder) {
  BlockPool p(4);
  p.check_invariants();
  EXPECT_EQ(p.free_order(), V({0, 1, 2, 3}));
  for (int32_t want = 0; want < 4; ++want) EXPECT_EQ(p.allocate(), want);
  EXPECT_EQ(p.allocate(), std::nullopt);  // exhausted: a normal answer, not an abort
  EXPECT_EQ(p.n_used(), 4);
  p.release(1);
  EXPECT_EQ(p.state(1), BlockState::Free);
  EXPECT_EQ(p.allocate(), 1);

  EXPECT_TRUE(p.set_key(2, key_of(1)));
  EXPECT_FALSE(p.set_key(3, key_of(1)));  // key already names block 2
  EXPECT_FALSE(p.set_key(2, key_of(2)));  // block 2 already keyed
  EXPECT_TRUE(p.set_key(3, key_of(2)));
  p.share(2);
  EXPECT_EQ(p.ref_count(2), 2);
  p.release(2);
  EXPECT_EQ(p.state(2), BlockState::Used);
  p.release(2);
  EXPECT_EQ(p.state(2), BlockState::Cached);  // keyed at ref 0: stays cached
  p.release(3);
  EXPECT_EQ(p.lru_order(), V({2, 3}));
  EXPECT_EQ(p.lookup(key_of(1)), 2);
  p.check_invariants();

  // Reviving a cached block takes it out of the LRU; releasing it again makes
  // it the most recently used.
  p.share(2);
  EXPECT_EQ(p.lru_order(), V({3}));
  EXPECT_EQ(p.ref_count(2), 1);
  p.release(2);
  EXPECT_EQ(p.lru_order(), V({3, 2}));

  p.release(0);  // unkeyed: free
  EXPECT_EQ(p.n_free(), 1);
  EXPECT_EQ(p.n_cached(), 2);
  EXPECT_EQ(p.n_available(), 3);
  EXPECT_EQ(p.allocate(), 0);      // the free list first: no eviction
  EXPECT_EQ(p.evictions(), 0);
  EXPECT_EQ(p.allocate(), 3);      // then the least recently used cached block
  EXPECT_EQ(p.lookup(key_of(2)), std::nullopt);  // its key went with it
  EXPECT_FALSE(p.has_key(3));
  EXPECT_EQ(p.allocate(), 2);
  EXPECT_EQ(p.evictions(), 2);
  EXPECT_EQ(p.allocate(), std::nullopt);
  p.check_invariants();

  V out = {42};
  EXPECT_FALSE(p.allocate(1, out));
  EXPECT_EQ(out, V({42}));  // all or nothing
  p.release(1);
  p.release(3);
  EXPECT_FALSE(p.allocate(3, out));
  EXPECT_TRUE(p.allocate(2, out));
  EXPECT_EQ(out, V({42, 3, 1}));  // free list is a stack: last freed first
  p.check_invariants();
}

TEST(BlockPool, MisuseThrowsAndBadSizes) {
  EXPECT_THROW(BlockPool(0), std::invalid_argument);
  BlockPool p(2);
  EXPECT_THROW(p.release(0), std::logic_error);  // free block
  EXPECT_THROW(p.share(1), std::logic_error);
  EXPECT_THROW(p.ref_count(2), std::logic_error);
  EXPECT_THROW(p.set_key(0, key_of(0)), std::logic_error);  // not used
  auto b = p.allocate();
  EXPECT_THROW(p.key(*b), std::logic_error);
  p.set_key(*b, key_of(9));
  p.release(*b);
  EXPECT_THROW(p.release(*b), std::logic_error);  // cached block
  p.drop_cached();
  EXPECT_EQ(p.n_free(), 2);
  p.check_invariants();
}

// Storage with one float per slot: the "K/V" of a token is its id.
struct Harness {
  static KvLayout layout(int bs) { return KvLayout{1, 1, 1, bs}; }
  Harness(int32_t n_blocks, int bs, bool caching = true)
      : storage(layout(bs), n_blocks), m(n_blocks, KvManagerOptions::basic(bs, caching), &storage) {}

  // reserve + "forward" (write each token into its slot) + commit.
  bool append(SeqId s, const V& toks) {
    if (!m.reserve(s, int(toks.size()))) return false;
    const auto& table = m.block_table(s);
    const int bs = m.block_size();
    int p = m.num_tokens(s);
    for (int32_t t : toks) {
      const int32_t b = table[p / bs];
      if (m.pool().ref_count(b) != 1 || m.pool().has_key(b)) throw std::logic_error("writing a block not owned alone");
      *storage.view().k(b, 0, p % bs) = float(t);
      ++p;
    }
    m.commit(s, toks);
    return true;
  }
  // Every token of the sequence reads back through its block table.
  void expect_reads_own_tokens(SeqId s) const {
    const auto& table = m.block_table(s);
    const auto& toks = m.tokens(s);
    const int bs = m.block_size();
    for (size_t p = 0; p < toks.size(); ++p)
      ASSERT_EQ(*storage.view().k(table[p / bs], 0, int(p % bs)), float(toks[p]))
          << "sequence " << s << " position " << p;
  }
  V refs(const V& blocks) const {
    V r;
    for (int32_t b : blocks) r.push_back(m.pool().ref_count(b));
    return r;
  }

  BlockStorage storage;
  KvManager m;
};

TEST(KvManager, ScriptedForkCowReleaseRehitEvict) {
  Harness h(8, 4);
  KvManager& m = h.m;
  const Scope sc = make_scope("model", "tenant");
  V p10(10);
  std::iota(p10.begin(), p10.end(), 1);  // 1..10

  // A: 10 tokens -> blocks 0, 1 (full, keyed) and 2 (2 of 4 slots).
  auto A = m.add_sequence(p10, sc);
  EXPECT_EQ(A.cached_tokens, 0);
  ASSERT_TRUE(h.append(A.seq, p10));
  EXPECT_EQ(m.block_table(A.seq), V({0, 1, 2}));
  EXPECT_TRUE(m.pool().has_key(0) && m.pool().has_key(1) && !m.pool().has_key(2));
  m.check_invariants(true);

  // B = fork(A): shares all three blocks.
  SeqId B = m.fork(A.seq);
  EXPECT_EQ(m.block_table(B), V({0, 1, 2}));
  EXPECT_EQ(h.refs({0, 1, 2}), V({2, 2, 2}));
  EXPECT_EQ(m.seq_info(B).shared_blocks, 3);

  // B writes into the shared partial block: copy-on-write into block 3.
  EXPECT_EQ(m.blocks_needed(B, 1), 1);
  ASSERT_TRUE(h.append(B, {99}));
  EXPECT_EQ(m.block_table(B), V({0, 1, 3}));
  EXPECT_EQ(h.refs({0, 1, 2, 3}), V({2, 2, 1, 1}));
  // A now owns block 2 alone: it writes in place and fills it.
  EXPECT_EQ(m.blocks_needed(A.seq, 2), 0);
  ASSERT_TRUE(h.append(A.seq, {11, 12}));
  EXPECT_EQ(m.block_table(A.seq), V({0, 1, 2}));
  EXPECT_TRUE(m.pool().has_key(2));
  h.expect_reads_own_tokens(A.seq);
  h.expect_reads_own_tokens(B);  // 1..10, 99: never A's 11
  KvStats st = m.stats();
  EXPECT_EQ(st.used_blocks, 4);
  EXPECT_EQ(st.stored_tokens, 4 + 4 + 4 + 3);
  EXPECT_EQ(st.waste_slots, 1);
  EXPECT_EQ(st.seq_tokens, 12 + 11);
  EXPECT_EQ(st.seq_blocks, 6);
  EXPECT_EQ(st.cow_copies, 1);
  m.check_invariants(true);

  // Release tail first: A's tail (2) becomes cached first; then B frees its
  // private block 3 and caches 1 then 0. Eviction order = tail before head.
  m.release(A.seq);
  EXPECT_EQ(m.pool().lru_order(), V({2}));
  m.release(B);
  EXPECT_EQ(m.pool().lru_order(), V({2, 1, 0}));
  EXPECT_EQ(m.pool().state(3), BlockState::Free);
  EXPECT_EQ(m.pool().n_used(), 0);
  m.check_invariants(true);

  // C shares the first 8 tokens: re-hit of blocks 0 and 1, revived from the LRU.
  V pc = {1, 2, 3, 4, 5, 6, 7, 8, 50, 51};
  auto C = m.add_sequence(pc, sc);
  EXPECT_EQ(C.cached_tokens, 8);
  EXPECT_EQ(m.block_table(C.seq), V({0, 1}));
  EXPECT_EQ(m.pool().lru_order(), V({2}));
  h.expect_reads_own_tokens(C.seq);

  // D's 12-token prompt is fully cached: it keeps all three blocks but sees
  // 11 tokens; its first write copies the keyed block 2 into block 3 and only
  // token 12 is recomputed. The copy duplicates the cached key, so it stays
  // unkeyed and block 2 stays the cached one.
  V p12(12);
  std::iota(p12.begin(), p12.end(), 1);
  auto D = m.add_sequence(p12, sc);
  EXPECT_EQ(D.cached_tokens, 11);
  EXPECT_EQ(m.block_table(D.seq), V({0, 1, 2}));
  EXPECT_EQ(h.refs({0, 1, 2}), V({2, 2, 1}));
  ASSERT_TRUE(h.append(D.seq, {12}));
  EXPECT_EQ(m.block_table(D.seq), V({0, 1, 3}));
  EXPECT_EQ(m.pool().lru_order(), V({2}));
  EXPECT_FALSE(m.pool().has_key(3));
  EXPECT_EQ(m.stats().cow_copies, 2);
  h.expect_reads_own_tokens(D.seq);
  m.check_invariants(true);

  // E takes the 4 free blocks and then evicts the only cached one (2).
  V pe(20);
  std::iota(pe.begin(), pe.end(), 200);
  auto E = m.add_sequence(pe, sc);
  EXPECT_EQ(E.cached_tokens, 0);
  ASSERT_TRUE(m.reserve(E.seq, 20));
  EXPECT_EQ(m.block_table(E.seq), V({4, 5, 6, 7, 2}));
  EXPECT_EQ(m.stats().evictions, 1);
  EXPECT_EQ(m.cached_prefix_blocks(p12, sc), 2);  // block 2's key is gone

  // Pool exhausted: reserve says no and changes nothing.
  const V c_table = m.block_table(C.seq);
  EXPECT_EQ(m.blocks_needed(C.seq, 2), 1);
  EXPECT_FALSE(m.reserve(C.seq, 2));
  EXPECT_EQ(m.block_table(C.seq), c_table);
  EXPECT_EQ(m.pool().n_available(), 0);
  m.check_invariants(true);

  m.release(D.seq);  // frees its private block 3; 1 and 0 stay with C
  EXPECT_EQ(m.pool().free_order(), V({3}));
  ASSERT_TRUE(h.append(C.seq, {50, 51}));
  EXPECT_EQ(m.block_table(C.seq), V({0, 1, 3}));
  h.expect_reads_own_tokens(C.seq);

  // E never ran: unreserve hands its blocks back (tail first onto the stack).
  m.unreserve(E.seq);
  EXPECT_EQ(m.block_table(E.seq), V({}));
  EXPECT_EQ(m.pool().free_order(), V({4, 5, 6, 7, 2}));
  m.release(E.seq);
  m.release(C.seq);
  EXPECT_EQ(m.pool().lru_order(), V({1, 0}));
  EXPECT_EQ(m.pool().n_free(), 6);
  m.check_invariants(true);
  m.drop_cached();
  EXPECT_EQ(m.pool().n_free(), 8);
  EXPECT_EQ(m.stats().prefix_query_tokens, 10 + 10 + 12 + 20);
  EXPECT_EQ(m.stats().prefix_hit_tokens, 8 + 11);
}

TEST(KvManager, ForkWithReservationSharesOnlyWrittenBlocks) {
  Harness h(8, 4);
  auto A = h.m.add_sequence(V{}, make_scope("m"));
  ASSERT_TRUE(h.append(A.seq, {1, 2, 3, 4, 5}));
  ASSERT_TRUE(h.m.reserve(A.seq, 8));  // blocks for 13 tokens, 5 written
  EXPECT_EQ(h.m.block_table(A.seq).size(), 4u);
  SeqId B = h.m.fork(A.seq);
  EXPECT_EQ(h.m.block_table(B), V({0, 1}));
  EXPECT_EQ(h.refs({0, 1, 2, 3}), V({2, 2, 1, 1}));
  h.m.check_invariants(true);
  ASSERT_TRUE(h.append(A.seq, {6}));  // A's partial block 1 is shared: copied
  EXPECT_EQ(h.m.block_table(A.seq)[1], 4);
  h.expect_reads_own_tokens(A.seq);
  h.expect_reads_own_tokens(B);
  h.m.check_invariants(true);
}

TEST(KvManager, BlockSizeOneFullyCachedPrompt) {
  Harness h(8, 1);
  const Scope sc = make_scope("m");
  auto A = h.m.add_sequence(V{5, 6, 7}, sc);
  ASSERT_TRUE(h.append(A.seq, {5, 6, 7}));
  h.m.release(A.seq);
  auto B = h.m.add_sequence(V{5, 6, 7}, sc);
  EXPECT_EQ(B.cached_tokens, 2);
  EXPECT_EQ(h.m.block_table(B.seq), V({0, 1}));  // the last block is not taken
  ASSERT_TRUE(h.append(B.seq, {7}));
  h.expect_reads_own_tokens(B.seq);
  h.m.check_invariants(true);
}

// Disaggregated decode: an adopted prompt pins its cached prefix, reserves
// the rest all or nothing, and once finished is keyed like a computed one.
TEST(KvManager, AdoptionReservesAllOrNothingAndKeysOnFinish) {
  Harness h(8, 4);
  KvManager& m = h.m;
  const Scope sc = make_scope("m", "t");
  V p10(10);
  std::iota(p10.begin(), p10.end(), 1);
  auto A = m.add_sequence(p10, sc);
  ASSERT_TRUE(h.append(A.seq, p10));
  m.release(A.seq);  // blocks 0, 1 cached (keyed), 2 free
  V p14 = p10;
  p14.resize(14);
  std::iota(p14.begin() + 10, p14.end(), 50);
  const KvManager::Adoption ad = m.reserve_adoption(p14, sc);
  ASSERT_GE(ad.seq, 0);
  EXPECT_EQ(ad.hit_blocks, 2);
  EXPECT_EQ(ad.blocks, 4);
  EXPECT_EQ(m.num_tokens(ad.seq), 8);
  EXPECT_EQ(m.pool().n_used(), 4);
  m.check_invariants(true);
  // Five more blocks do not fit in the four left: nothing changes.
  V other(20, 9);
  EXPECT_EQ(m.reserve_adoption(other, sc).seq, -1);
  EXPECT_EQ(m.pool().n_used(), 4);
  m.check_invariants(true);
  // The bytes "arrived": write them as a forward would, then finish.
  const auto& table = m.block_table(ad.seq);
  for (size_t p = 8; p < p14.size(); ++p) *h.storage.view().k(table[p / 4], 0, int(p % 4)) = float(p14[p]);
  m.finish_adoption(ad.seq, p14);
  EXPECT_EQ(m.num_tokens(ad.seq), 14);
  EXPECT_EQ(m.cached_prefix_blocks(p14, sc), 3);  // block 2 keyed now; block 3 holds 2 of 4 slots
  h.expect_reads_own_tokens(ad.seq);
  m.check_invariants(true);
  EXPECT_THROW(m.finish_adoption(ad.seq, other), std::logic_error);
  m.release(ad.seq);
  EXPECT_EQ(m.pool().n_used(), 0);
}

TEST(KvManager, DropByScopeAndByAge) {
  Harness h(8, 2);
  KvManager& m = h.m;
  const Scope a = make_scope("m", "a"), b = make_scope("m", "b");
  m.set_tick(10);
  auto A = m.add_sequence(V{1, 2, 3, 4, 5}, a);  // blocks 0 1 full, 2 partial
  ASSERT_TRUE(h.append(A.seq, {1, 2, 3, 4, 5}));
  m.set_tick(20);
  auto B = m.add_sequence(V{1, 2, 3, 4, 5}, b);  // other scope: no hit, blocks 3 4 5
  EXPECT_EQ(B.cached_tokens, 0);
  ASSERT_TRUE(h.append(B.seq, {1, 2, 3, 4, 5}));
  EXPECT_EQ(m.block_table(B.seq), V({3, 4, 5}));
  m.set_tick(30);
  m.release(A.seq);  // 0 1 cached at tick 30, 2 free
  m.set_tick(40);
  m.release(B.seq);  // 3 4 cached at tick 40, 5 free
  EXPECT_EQ(m.pool().lru_order(), V({1, 0, 4, 3}));
  EXPECT_EQ(m.pool().last_use(0), 30);
  EXPECT_EQ(m.pool().last_use(4), 40);
  EXPECT_TRUE(m.pool().scope_of(0) == a);
  EXPECT_TRUE(m.pool().scope_of(3) == b);
  m.check_invariants(true);

  // By age: only a's blocks, only those last used before the cutoff.
  EXPECT_EQ(m.drop_cached_older_than(a, 30), 0);
  EXPECT_EQ(m.drop_cached_older_than(b, 35), 0);
  EXPECT_EQ(m.drop_cached_older_than(a, 31), 2);
  EXPECT_EQ(m.pool().lru_order(), V({4, 3}));
  EXPECT_EQ(m.pool().free_order(), V({0, 1, 5, 2, 6, 7}));
  m.check_invariants(true);
  auto A2 = m.add_sequence(V{1, 2, 3, 4, 5}, a);
  EXPECT_EQ(A2.cached_tokens, 0) << "dropped blocks must miss";
  m.release(A2.seq);

  // A hit refreshes the last use: b's chain used at tick 50 survives cutoff 45.
  m.set_tick(50);
  auto B2 = m.add_sequence(V{1, 2, 3, 4, 9}, b);
  EXPECT_EQ(B2.cached_tokens, 4);
  ASSERT_TRUE(h.append(B2.seq, {9}));
  m.release(B2.seq);
  EXPECT_EQ(m.pool().lru_order(), V({4, 3}));
  EXPECT_EQ(m.drop_cached_older_than(b, 45), 0);

  // By scope while a sequence of it runs: cached blocks go at once, the held
  // ones lose their key and go free on release; new full blocks get no key.
  m.set_tick(60);
  auto B3 = m.add_sequence(V{1, 2, 3, 4, 7}, b);  // shares 3 4
  EXPECT_EQ(B3.cached_tokens, 4);
  ASSERT_TRUE(h.append(B3.seq, {7}));
  m.release(B3.seq);
  auto B4 = m.add_sequence(V{1, 2, 9}, b);  // holds 3 only; 4 stays cached
  EXPECT_EQ(B4.cached_tokens, 2);
  EXPECT_EQ(m.block_table(B4.seq), V({3}));
  EXPECT_EQ(m.pool().lru_order(), V({4}));
  EXPECT_EQ(m.drop_cached_scope(b), 1);  // 4
  EXPECT_EQ(m.pool().n_cached(), 0);
  EXPECT_FALSE(m.pool().has_key(3));
  m.check_invariants(true);
  ASSERT_TRUE(h.append(B4.seq, {9, 8, 7}));  // fills another block: not keyed
  for (int32_t blk : m.block_table(B4.seq)) EXPECT_FALSE(m.pool().has_key(blk));
  h.expect_reads_own_tokens(B4.seq);
  const V held = m.block_table(B4.seq);
  m.release(B4.seq);
  EXPECT_EQ(m.pool().n_cached(), 0) << "a dropped scope's blocks go free on release";
  EXPECT_EQ(m.pool().n_free(), 8);
  m.check_invariants(true);
  // After its last sequence ended the scope caches again (a new request of a
  // revoked scope cannot arrive: the server issues the new scope).
  auto B5 = m.add_sequence(V{1, 2, 3}, b);
  ASSERT_TRUE(h.append(B5.seq, {1, 2, 3}));
  m.release(B5.seq);
  EXPECT_EQ(m.pool().n_cached(), 1);
  m.check_invariants(true);
}

// 100k random operations over a small pool (so it is exhausted and evicts
// often) and a 4-token vocabulary (so prefixes are shared often).
TEST(KvManager, RandomizedStress100k) {
  for (bool caching : {true, false}) {
    SCOPED_TRACE(caching ? "prefix caching on" : "prefix caching off");
    const int bs = 4;
    const int32_t n_blocks = 48;
    Harness h(n_blocks, bs, caching);
    KvManager& m = h.m;
    std::mt19937_64 rng(caching ? 12345 : 777);
    auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const Scope scopes[2] = {make_scope("m", "a"), make_scope("m", "b")};
    std::map<SeqId, V> shadow;  // what each sequence must read back
    int64_t hits = 0, failures = 0, forks = 0;

    auto random_tokens = [&](int n) {
      V t(n);
      // Prompts start with a common "system prompt" most of the time.
      for (int i = 0; i < n; ++i) t[i] = (i < 12 && rnd(0, 3)) ? i % 4 : rnd(0, 3);
      return t;
    };
    auto pick = [&]() {
      auto it = shadow.begin();
      std::advance(it, rnd(0, int(shadow.size()) - 1));
      return it->first;
    };

    const int kOps = 100000;
    for (int op = 0; op < kOps; ++op) {
      const int kind = rnd(0, 99);
      m.set_tick(op);
      if (kind < 20 && shadow.size() < 16) {  // add (+ prefill the uncached rest)
        V prompt = random_tokens(rnd(0, 30));
        auto a = m.add_sequence(prompt, scopes[rnd(0, 1)]);
        ASSERT_LE(a.cached_tokens, std::max<int>(0, int(prompt.size()) - 1));
        hits += a.cached_tokens;
        shadow[a.seq] = V(prompt.begin(), prompt.begin() + a.cached_tokens);
        h.expect_reads_own_tokens(a.seq);
        V rest(prompt.begin() + a.cached_tokens, prompt.end());
        if (h.append(a.seq, rest)) shadow[a.seq] = prompt;
        else ++failures;
      } else if (kind < 60 && !shadow.empty()) {  // extend (decode or a chunk)
        SeqId s = pick();
        V t = random_tokens(rnd(1, 6));
        const V table = m.block_table(s);
        const int32_t avail = m.pool().n_available();
        if (h.append(s, t)) {
          shadow[s].insert(shadow[s].end(), t.begin(), t.end());
        } else {
          ++failures;
          ASSERT_EQ(m.block_table(s), table) << "failed reserve changed the table";
          ASSERT_EQ(m.pool().n_available(), avail) << "failed reserve changed the pool";
        }
      } else if (kind < 70 && !shadow.empty()) {  // fork
        SeqId c = m.fork(pick());
        shadow[c] = m.tokens(c);
        ++forks;
      } else if (kind < 75 && !shadow.empty()) {  // reserve ahead, then give it back
        SeqId s = pick();
        if (m.reserve(s, rnd(1, 12))) m.unreserve(s);
      } else if (kind < 98 && !shadow.empty()) {  // release
        SeqId s = pick();
        m.release(s);
        shadow.erase(s);
      } else if (kind < 99) {  // explicit eviction: everything, one scope, or by age
        if (op % 3 == 0) m.drop_cached();
        else if (op % 3 == 1) m.drop_cached_scope(scopes[op % 2]);
        else m.drop_cached_older_than(scopes[op % 2], op - 200);
      }
      // Invariants after every single operation.
      ASSERT_NO_THROW(m.check_invariants(op % 1000 == 0)) << "after operation " << op;
      const KvStats st = m.stats();
      ASSERT_EQ(st.free_blocks + st.cached_blocks + st.used_blocks, n_blocks);
      if (op % 97 == 0)
        for (auto& [s, toks] : shadow) {
          ASSERT_EQ(m.tokens(s), toks);
          h.expect_reads_own_tokens(s);
        }
    }
    for (auto& [s, toks] : shadow) h.expect_reads_own_tokens(s);
    // Nothing leaks: releasing every sequence leaves no used block.
    for (auto& [s, toks] : shadow) m.release(s);
    m.check_invariants(true);
    EXPECT_EQ(m.pool().n_used(), 0);
    EXPECT_EQ(m.pool().n_free() + m.pool().n_cached(), n_blocks);
    m.drop_cached();
    EXPECT_EQ(m.pool().n_free(), n_blocks);
    m.check_invariants(true);
    // The run must have exercised what it claims to.
    std::printf("caching=%d: %lld failed reserves, %lld forks, %lld hit tokens, %lld evictions, %lld copies\n",
                int(caching), (long long)failures, (long long)forks, (long long)hits,
                (long long)m.stats().evictions, (long long)m.stats().cow_copies);
    EXPECT_GT(failures, 100);
    EXPECT_GT(forks, 1000);
    if (caching) {
      EXPECT_GT(hits, 1000);
      EXPECT_GT(m.stats().evictions, 100);
      EXPECT_GT(m.stats().cow_copies, 100);
    }
  }
}

}  // namespace

// The pool has one writer (kv/owner_thread.h): a change from another thread
// aborts, naming the call, in every build with assertions (the sanitizer
// runs); binding hands the pool to another thread, as the engine loop does
// when its thread starts and when it is joined.
TEST(OwnerThread, AChangeFromAnotherThreadAbortsAndBindingMovesTheOwner) {
#ifdef NDEBUG
  GTEST_SKIP() << "owner checks are compiled into builds with assertions (scripts/sanitize.sh runs this)";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Scope sc = make_scope("m", "t");
  const std::vector<int32_t> p = {1, 2, 3, 4, 5};
  EXPECT_DEATH(
      {
        KvManager m(8, KvManagerOptions::basic(4, true));
        const SeqId s = m.add_sequence(p, sc).seq;  // this thread owns the pool now
        std::thread([&] { m.release(s); }).join();
      },
      "KvManager::release called from a thread that does not own the KV pool");
  EXPECT_DEATH(
      {
        BlockPool pool(4);
        (void)pool.allocate();
        std::thread([&] { (void)pool.allocate(); }).join();
      },
      "BlockPool::allocate called from a thread");
  KvManager m(8, KvManagerOptions::basic(4, true));
  const SeqId s = m.add_sequence(p, sc).seq;
  std::thread([&] {
    m.bind_owner_thread();  // the new owner changes it; nothing aborts
    ASSERT_TRUE(m.reserve(s, 5));
    m.commit(s, p);
    m.release(s);
  }).join();
  m.bind_owner_thread();
  EXPECT_EQ(m.used_blocks(), 0);
  m.check_invariants();
#endif
}
