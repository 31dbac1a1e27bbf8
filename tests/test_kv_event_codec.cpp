// vLLM's EventBatch as msgpack: encoding (chains grouped, hashes as the key's
// low 64 bits, big-endian) and the decoder a router uses, which refuses
// anything that is not a well-formed batch without throwing or allocating
// what a forged length claims.
#include <gtest/gtest.h>

#include <random>

#include "events/kv_event_codec.h"

using namespace kvs;
using namespace kvs::events;

namespace {

KvEvent stored(const BlockKey& key, const BlockKey* parent, std::vector<int32_t> tokens = {}) {
  KvEvent e;
  e.kind = KvEvent::Kind::Stored;
  e.key = key;
  e.has_parent = parent != nullptr;
  if (parent) e.parent = *parent;
  e.tokens = std::move(tokens);
  return e;
}

BlockKey key(uint8_t x) {
  BlockKey k{};
  k[0] = 0xEE;  // not part of the hash
  k[31] = x;
  k[24] = 0x80;  // top bit set: an unsigned value above INT64_MAX
  return k;
}

}  // namespace

TEST(KvEventCodec, HashIsTheKeysLastEightBytesBigEndian) {
  BlockKey k{};
  for (size_t i = 0; i < 32; ++i) k[i] = uint8_t(i);
  EXPECT_EQ(block_hash(k), 0x18191a1b1c1d1e1fULL);
}

TEST(KvEventCodec, RoundTripGroupsChainsAndRemovals) {
  const BlockKey a = key(1), b = key(2), c = key(3), d = key(4);
  std::vector<KvEvent> ev = {stored(a, nullptr, {1, 2}), stored(b, &a, {3, 4}), stored(c, nullptr, {5, 6})};
  KvEvent r1, r2;
  r1.kind = r2.kind = KvEvent::Kind::Removed;
  r1.key = b;
  r2.key = d;
  ev.push_back(r1);
  ev.push_back(r2);
  const std::string bytes = encode_batch(1700000000.25, ev, 2, true);
  std::string err;
  const auto w = decode_batch(bytes.data(), bytes.size(), &err);
  ASSERT_TRUE(w) << err;
  EXPECT_DOUBLE_EQ(w->ts, 1700000000.25);
  ASSERT_EQ(w->events.size(), 4u);  // cleared, chain a-b, c, removals b+d
  EXPECT_EQ(w->events[0].kind, WireEvent::Kind::Cleared);
  EXPECT_EQ(w->events[1].kind, WireEvent::Kind::Stored);
  EXPECT_EQ(w->events[1].hashes, std::vector<uint64_t>({block_hash(a), block_hash(b)}));
  EXPECT_FALSE(w->events[1].parent);
  EXPECT_EQ(w->events[1].block_size, 2);
  EXPECT_EQ(w->events[2].hashes, std::vector<uint64_t>({block_hash(c)}));
  EXPECT_EQ(w->events[3].kind, WireEvent::Kind::Removed);
  EXPECT_EQ(w->events[3].hashes, std::vector<uint64_t>({block_hash(b), block_hash(d)}));
  EXPECT_GT(block_hash(a), uint64_t(INT64_MAX));

  // A chain continued in a later batch names its parent.
  const std::string next = encode_batch(1, {stored(d, &c)}, 2);
  const auto w2 = decode_batch(next.data(), next.size());
  ASSERT_TRUE(w2);
  EXPECT_EQ(w2->events[0].parent, block_hash(c));
}

TEST(KvEventCodec, MalformedPayloadsAreRefused) {
  std::string err;
  const std::string ok = encode_batch(1, {stored(key(1), nullptr)}, 16);
  EXPECT_FALSE(decode_batch("", 0, &err));
  EXPECT_FALSE(decode_batch(ok.data(), ok.size() - 1, &err));  // truncated
  const std::string trailing = ok + "x";
  EXPECT_FALSE(decode_batch(trailing.data(), trailing.size(), &err));
  EXPECT_NE(err.find("trailing"), std::string::npos) << err;
  // An array header claiming 2^32-1 elements in five bytes.
  const std::string forged("\xdd\xff\xff\xff\xff", 5);
  EXPECT_FALSE(decode_batch(forged.data(), forged.size(), &err));
  // msgpack [1.0, [["Bogus"]]]
  const std::string bogus("\x92\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x91\x91\xa5" "Bogus", 18);
  EXPECT_FALSE(decode_batch(bogus.data(), bogus.size(), &err));
  EXPECT_NE(err.find("unknown event tag"), std::string::npos) << err;
  // Random bytes never crash the decoder.
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string junk = ok;
    for (int k = 0; k < 3; ++k) junk[rng() % junk.size()] = char(rng());
    (void)decode_batch(junk.data(), junk.size());
  }
}
