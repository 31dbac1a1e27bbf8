// The messages of a KV transfer between a prefill worker and a decode worker
// (docs/DISAGG.md, "Protocol"). Each travels as one UCX active message whose
// header is encoded here; block and residual bytes travel as the message's
// data, so the receiver can land them straight in pool memory.
//
//   prefill                                   decode
//   Hello (identity)                  ->
//                                     <-      HelloReply (ok / refused + why)
//   Offer (xfer, scope, tokens,
//          first token, chain keys)   ->      reserves hits + fresh blocks
//                                     <-      Answer (send blocks [from, to) / no room / refused)
//   Block (xfer, index) + bytes       ->      lands in the reserved block
//   Done (xfer) + residual floats     ->      keys the blocks, holds the sequence
//                                     <-      Result (ok + handle / failed + why)
//
// Decoding is strict: a wrong size, an unknown type or a count that does not
// match the bytes is "garbled" (std::nullopt), never a partial message.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "disagg/kv_identity.h"
#include "kv/prefix_hash.h"

namespace kvs::disagg {

enum class MsgType : uint8_t { Hello = 1, HelloReply, Offer, Answer, Block, Done, Result };

struct HelloReply {
  bool ok = false;
  std::string reason;  // why the decode side refused (empty when ok)
  KvIdentity identity;  // the decode side's, so the prefill side can say what differs
};

struct Offer {
  uint64_t xfer = 0;             // chosen by the prefill side, unique per connection
  Scope scope;                   // the caller scope (each side folds in its model identity)
  int32_t first_token = -1;      // sampled by the prefill side from the prompt's last logits
  std::vector<int32_t> tokens;   // the prompt
  std::vector<BlockKey> keys;    // chain keys of its full blocks, as the prefill side keyed them
};

enum class AnswerKind : uint8_t { Send = 1, NoRoom, Refused };
struct Answer {
  uint64_t xfer = 0;
  AnswerKind kind = AnswerKind::Refused;
  uint32_t from = 0, to = 0;     // Send: blocks [from, to) of the prompt's table; [0, from) were hits
  uint32_t retry_after_ms = 0;   // NoRoom
  std::string reason;            // NoRoom / Refused
};

struct BlockHeader {
  uint64_t xfer = 0;
  uint32_t index = 0;            // position in the prompt's table
};

struct DoneHeader {
  uint64_t xfer = 0;
  uint32_t blocks = 0;           // blocks sent (the receiver checks it got them all)
};

struct Result {
  uint64_t xfer = 0;
  bool ok = false;
  uint64_t handle = 0;           // ok: names the adopted sequence on the decode side
  std::string reason;
};

std::vector<uint8_t> encode_hello(const KvIdentity& id);
std::vector<uint8_t> encode(const HelloReply& m);
std::vector<uint8_t> encode(const Offer& m);
std::vector<uint8_t> encode(const Answer& m);
std::vector<uint8_t> encode(const BlockHeader& m);
std::vector<uint8_t> encode(const DoneHeader& m);
std::vector<uint8_t> encode(const Result& m);

// The type byte of a header; nullopt for an empty header or an unknown type.
std::optional<MsgType> peek_type(std::span<const uint8_t> h);
std::optional<KvIdentity> decode_hello(std::span<const uint8_t> h);
std::optional<HelloReply> decode_hello_reply(std::span<const uint8_t> h);
std::optional<Offer> decode_offer(std::span<const uint8_t> h);
std::optional<Answer> decode_answer(std::span<const uint8_t> h);
std::optional<BlockHeader> decode_block(std::span<const uint8_t> h);
std::optional<DoneHeader> decode_done(std::span<const uint8_t> h);
std::optional<Result> decode_result(std::span<const uint8_t> h);

}  // namespace kvs::disagg
