// Prefix-cache keys: the exact SHA-256 construction (known answers computed
// independently with Python's hashlib), chaining (a changed token changes its
// block's key and every later one, never an earlier one), scoping, and what
// that means for hits in the KV manager.
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/prefix_chain.h"
#include "kv/prefix_hash.h"

using namespace kvs;

namespace {

std::vector<BlockKey> chain(const std::vector<int32_t>& toks, int bs, const Scope& sc) {
  std::vector<BlockKey> keys;
  for (size_t i = 0; (i + 1) * bs <= toks.size(); ++i)
    keys.push_back(block_key(keys.empty() ? nullptr : &keys.back(), &toks[i * bs], bs, sc));
  return keys;
}

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(PrefixHash, KnownAnswers) {
  // sha256(zeros(32) ‖ int32le 1,2,3,4 ‖ zeros(32))
  const Scope zero{};
  const int32_t b0[] = {1, 2, 3, 4};
  const BlockKey k0 = block_key(nullptr, b0, 4, zero);
  EXPECT_EQ(to_hex(k0), "ded0c4fcd560039cc9295965ec2eb07022a8c1b5ce9ce13db92c5a2245a0bd1c");
  // Chained, with negative and > 16-bit ids (little-endian two's complement).
  const int32_t b1[] = {-1, 70000, 0, 5};
  EXPECT_EQ(to_hex(block_key(&k0, b1, 4, zero)), "82097ca6c8b5743e353933de9987e062d3c23e7bcfc251cc40336d0f182b5660");
  // sha256("kvserve/kv-scope/v1" ‖ u64le 5 ‖ "model" ‖ u64le 6 ‖ "tenant")
  EXPECT_EQ(to_hex(make_scope("model", "tenant").bytes),
            "d9fcf1a66b5e7bca69c89ddab2906a34fd7f55d3226d5b9c5dfc56c69a5f1a34");
}

// The one walker (kv/prefix_chain.h) against the hand-written chain above:
// whole, limited, resumed from a parent, and stopped by its visitor.
TEST(PrefixChain, WalkerIsTheChain) {
  const Scope sc = make_scope("m", "t");
  const std::vector<int32_t> toks = iota_tokens(23, 5);  // five full blocks of 4, three tokens over
  const std::vector<BlockKey> want = chain(toks, 4, sc);
  ASSERT_EQ(want.size(), 5u);
  EXPECT_EQ(chain_keys(toks, 4, sc), want);
  EXPECT_EQ(chain_keys(toks, 4, sc, 2), std::vector<BlockKey>(want.begin(), want.begin() + 2));
  std::vector<int64_t> idx;
  std::vector<BlockKey> tail;
  const int64_t n = walk_chain(
      toks, 4, sc,
      [&](int64_t i, const BlockKey& k) {
        idx.push_back(i);
        tail.push_back(k);
        return i < 3;  // stop at block 3: visited, not counted
      },
      2, &want[1]);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(idx, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(tail, (std::vector<BlockKey>{want[2], want[3]}));
  EXPECT_TRUE(chain_keys(iota_tokens(3), 4, sc).empty());
}

TEST(PrefixChain, ScopeBindsTheModelIdentityAndTheProtocolHasAFingerprint) {
  const Scope caller = make_scope("server", "tenant");
  const std::string_view bytes(reinterpret_cast<const char*>(caller.bytes.data()), caller.bytes.size());
  EXPECT_EQ(kv_scope("model-a", caller), make_scope("model-a", bytes));
  EXPECT_FALSE(kv_scope("model-a", caller) == kv_scope("model-b", caller));
  const std::string fp = prefix_key_protocol();
  EXPECT_EQ(fp.rfind("kv-prefix-v1:", 0), 0u) << fp;
  EXPECT_EQ(fp.size(), std::string("kv-prefix-v1:").size() + 16);
  EXPECT_EQ(fp, prefix_key_protocol());
}

TEST(PrefixHash, ScopeIsLengthPrefixed) {
  EXPECT_NE(make_scope("ab", "c"), make_scope("a", "bc"));
  EXPECT_NE(make_scope("m", ""), make_scope("m", std::string_view("\0", 1)));
  EXPECT_EQ(make_scope("m", "t"), make_scope("m", "t"));
  EXPECT_NE(make_scope("m1", "t"), make_scope("m2", "t"));  // model identity is always part of it
}

TEST(PrefixHash, SameTokensSameScopeSameKeys) {
  const Scope sc = make_scope("model", "tenant-a");
  auto t = iota_tokens(64, 100);
  EXPECT_EQ(chain(t, 16, sc), chain(t, 16, sc));
}

TEST(PrefixHash, DifferentScopeDifferentKeys) {
  auto t = iota_tokens(64, 100);
  auto a = chain(t, 16, make_scope("model", "tenant-a"));
  auto b = chain(t, 16, make_scope("model", "tenant-b"));
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i], b[i]) << "block " << i;
}

TEST(PrefixHash, ChangedTokenChangesItsBlockAndAllLaterOnes) {
  const Scope sc = make_scope("model", "t");
  const int bs = 8, nb = 6;
  auto base = iota_tokens(bs * nb, 7);
  auto ref = chain(base, bs, sc);
  for (int pos = 0; pos < bs * nb; ++pos) {
    auto t = base;
    t[pos] ^= 0x40000;  // a single bit, far from the low byte
    auto k = chain(t, bs, sc);
    const int changed_block = pos / bs;
    for (int i = 0; i < nb; ++i) {
      if (i < changed_block) EXPECT_EQ(k[i], ref[i]) << "pos " << pos << " block " << i;
      else EXPECT_NE(k[i], ref[i]) << "pos " << pos << " block " << i;
    }
  }
  // Same block content at a different place in the chain: different key.
  std::vector<int32_t> twice(16, 5);
  auto k = chain(twice, 8, sc);
  EXPECT_NE(k[0], k[1]);
}

TEST(PrefixHash, NoCollisionsAmongManySmallBlocks) {
  // Every 2-token block over a 64-token vocabulary, under two parents.
  const Scope sc = make_scope("m");
  std::set<BlockKey> seen;
  const int32_t root_tokens[] = {0, 0};
  const BlockKey parent = block_key(nullptr, root_tokens, 2, sc);
  for (int p = 0; p < 2; ++p)
    for (int32_t a = 0; a < 64; ++a)
      for (int32_t b = 0; b < 64; ++b) {
        const int32_t t[] = {a, b};
        EXPECT_TRUE(seen.insert(block_key(p ? &parent : nullptr, t, 2, sc)).second);
      }
}

// What the keys mean for the cache: hits need the same tokens *and* scope.
TEST(PrefixHash, ManagerHitsOnlyWithinScope) {
  KvManager m(32, KvManagerOptions::basic(4, true));
  const Scope a = make_scope("model", "tenant-a"), b = make_scope("model", "tenant-b");
  auto prompt = iota_tokens(13, 1);  // 3 full blocks + 1 token
  auto s0 = m.add_sequence(prompt, a);
  EXPECT_EQ(s0.cached_tokens, 0);
  ASSERT_TRUE(m.reserve(s0.seq, 13));
  m.commit(s0.seq, prompt);
  m.release(s0.seq);

  auto hit = m.add_sequence(prompt, a);
  EXPECT_EQ(hit.cached_tokens, 12);
  auto miss = m.add_sequence(prompt, b);
  EXPECT_EQ(miss.cached_tokens, 0);
  auto other = prompt;
  other[5] = 99;  // block 1 differs: only block 0 can be reused
  auto partial = m.add_sequence(other, a);
  EXPECT_EQ(partial.cached_tokens, 4);
  EXPECT_EQ(m.cached_prefix_blocks(prompt, a), 3);
  EXPECT_EQ(m.cached_prefix_blocks(prompt, b), 0);
  const KvStats st = m.stats();
  EXPECT_EQ(st.prefix_query_tokens, 13 * 4);
  EXPECT_EQ(st.prefix_hit_tokens, 12 + 4);
  m.check_invariants(true);
}

TEST(PrefixHash, DisabledCacheNeverHits) {
  KvManager m(32, KvManagerOptions::basic(4, false));
  const Scope a = make_scope("model");
  auto prompt = iota_tokens(12, 1);
  auto s0 = m.add_sequence(prompt, a);
  ASSERT_TRUE(m.reserve(s0.seq, 12));
  m.commit(s0.seq, prompt);
  m.release(s0.seq);
  EXPECT_EQ(m.pool().n_cached(), 0);
  EXPECT_EQ(m.add_sequence(prompt, a).cached_tokens, 0);
  m.check_invariants(true);
}

}  // namespace
