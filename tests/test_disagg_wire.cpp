// The KV transfer protocol's messages (src/disagg/wire.h) and the handshake
// identity: every message round-trips, and any truncation, extension or bad
// field is refused as garbled rather than half-read.
#include <gtest/gtest.h>

#include "disagg/kv_identity.h"
#include "disagg/wire.h"

using namespace kvs;
using namespace kvs::disagg;

namespace {

KvIdentity sample_identity() {
  KvLayout l;
  l.n_layers = 5;
  l.n_kv_heads = 4;
  l.head_dim = 8;
  l.block_size = 16;
  l.type = KvType::F16;
  return make_identity("model-hash", l);
}

Offer sample_offer() {
  Offer o;
  o.xfer = 42;
  o.scope = make_scope("m", "tenant");
  o.first_token = 7;
  o.tokens = {1, 2, 3, 4, 5};
  o.keys.resize(2);
  o.keys[0].fill(0xaa);
  o.keys[1].fill(0xbb);
  return o;
}

// Every strict prefix of a message and the message plus one byte must be refused.
template <class Decode>
void expect_strict(const std::vector<uint8_t>& wire, Decode decode) {
  for (size_t n = 0; n < wire.size(); ++n)
    EXPECT_FALSE(decode(std::span<const uint8_t>(wire.data(), n))) << "prefix of " << n << " bytes accepted";
  std::vector<uint8_t> longer = wire;
  longer.push_back(0);
  EXPECT_FALSE(decode(longer)) << "trailing byte accepted";
}

TEST(DisaggWire, EveryMessageRoundTrips) {
  const KvIdentity id = sample_identity();
  EXPECT_EQ(*decode_hello(encode_hello(id)), id);
  const HelloReply hr{false, "kv type: f16 here, f32 there", id};
  const auto hr2 = decode_hello_reply(encode(hr));
  ASSERT_TRUE(hr2);
  EXPECT_EQ(hr2->reason, hr.reason);
  EXPECT_EQ(hr2->identity, id);
  const Offer o = sample_offer();
  const auto o2 = decode_offer(encode(o));
  ASSERT_TRUE(o2);
  EXPECT_EQ(o2->xfer, 42u);
  EXPECT_EQ(o2->scope, o.scope);
  EXPECT_EQ(o2->tokens, o.tokens);
  EXPECT_EQ(o2->keys, o.keys);
  EXPECT_EQ(o2->first_token, 7);
  const Answer a{9, AnswerKind::Send, 2, 7, 0, ""};
  const auto a2 = decode_answer(encode(a));
  ASSERT_TRUE(a2);
  EXPECT_EQ(a2->kind, AnswerKind::Send);
  EXPECT_EQ(a2->from, 2u);
  EXPECT_EQ(a2->to, 7u);
  EXPECT_EQ(decode_block(encode(BlockHeader{9, 3}))->index, 3u);
  EXPECT_EQ(decode_done(encode(DoneHeader{9, 5}))->blocks, 5u);
  const auto r2 = decode_result(encode(Result{9, true, 77, ""}));
  ASSERT_TRUE(r2);
  EXPECT_TRUE(r2->ok);
  EXPECT_EQ(r2->handle, 77u);
}

TEST(DisaggWire, TruncatedOrExtendedMessagesAreGarbled) {
  expect_strict(encode_hello(sample_identity()), [](auto s) { return decode_hello(s).has_value(); });
  expect_strict(encode(HelloReply{true, "", sample_identity()}), [](auto s) { return decode_hello_reply(s).has_value(); });
  expect_strict(encode(sample_offer()), [](auto s) { return decode_offer(s).has_value(); });
  expect_strict(encode(Answer{1, AnswerKind::NoRoom, 0, 0, 1000, "full"}), [](auto s) { return decode_answer(s).has_value(); });
  expect_strict(encode(BlockHeader{1, 2}), [](auto s) { return decode_block(s).has_value(); });
  expect_strict(encode(DoneHeader{1, 2}), [](auto s) { return decode_done(s).has_value(); });
  expect_strict(encode(Result{1, false, 0, "why"}), [](auto s) { return decode_result(s).has_value(); });
}

TEST(DisaggWire, BadFieldsAreGarbled) {
  // One message type decoded as another.
  EXPECT_FALSE(decode_offer(encode(BlockHeader{1, 2})));
  EXPECT_FALSE(peek_type(std::vector<uint8_t>{}));
  EXPECT_FALSE(peek_type(std::vector<uint8_t>{0x99, 0, 0}));
  // A token count larger than the bytes that follow.
  std::vector<uint8_t> w = encode(sample_offer());
  w[1 + 8 + 32 + 4] = 0xff;
  EXPECT_FALSE(decode_offer(w));
  // An answer kind outside the enum, and a range that runs backwards.
  std::vector<uint8_t> a = encode(Answer{1, AnswerKind::Send, 0, 3, 0, ""});
  a[1 + 8] = 9;
  EXPECT_FALSE(decode_answer(a));
  EXPECT_FALSE(decode_answer(encode(Answer{1, AnswerKind::Send, 4, 3, 0, ""})));
  // An offer with no tokens.
  Offer empty = sample_offer();
  empty.tokens.clear();
  EXPECT_FALSE(decode_offer(encode(empty)));
}

TEST(DisaggIdentity, MismatchNamesEveryDifferingField) {
  const KvIdentity a = sample_identity();
  EXPECT_EQ(mismatch(a, a), "");
  KvIdentity b = a;
  b.kv_type = "f32";
  b.block_bytes *= 2;
  const std::string m = mismatch(a, b);
  EXPECT_NE(m.find("kv type: f16 here, f32 there"), std::string::npos) << m;
  EXPECT_NE(m.find("block bytes"), std::string::npos) << m;
  KvIdentity c = a;
  c.model = "another-model";
  c.version = kProtocolVersion + 1;
  const std::string mc = mismatch(a, c);
  EXPECT_NE(mc.find("model: different weights"), std::string::npos) << mc;
  EXPECT_NE(mc.find("protocol version"), std::string::npos) << mc;
}

}  // namespace
