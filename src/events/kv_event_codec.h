// KV-cache events in vLLM's wire format (vllm/distributed/kv_events.py, the
// msgspec structs with array_like=True and tag=True), as msgpack:
//
//   EventBatch       [ts, [event, ...], data_parallel_rank]
//   BlockStored      ["BlockStored", block_hashes, parent_block_hash | nil,
//                     token_ids, block_size, lora_id | nil, medium | nil]
//   BlockRemoved     ["BlockRemoved", block_hashes, medium | nil]
//   AllBlocksCleared ["AllBlocksCleared"]
//
// Block hashes are integers, as vLLM sends them with int block hashes: the
// low 64 bits of the 32-byte chained key read as a big-endian number (its
// last 8 bytes), an unsigned 64-bit value. kvserve keys already fold in the
// tenant scope and the model, so equal hashes from two workers mean the same
// tokens under the same scope.
//
// Consecutive Stored events that continue one chain become one BlockStored
// (vLLM groups a request's new blocks the same way); consecutive Removed
// events become one BlockRemoved.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kv/kv_events.h"

namespace kvs::events {

// The "medium" kvserve reports: its blocks live in host memory.
inline constexpr const char* kMedium = "CPU";

uint64_t block_hash(const BlockKey& key);

// One batch's msgpack bytes. `cleared` puts an AllBlocksCleared first.
std::string encode_batch(double ts, const std::vector<KvEvent>& events, int block_size, bool cleared = false,
                         int dp_rank = 0);

// A decoded event (what a router needs; token ids are dropped).
struct WireEvent {
  enum class Kind : uint8_t { Stored, Removed, Cleared };
  Kind kind = Kind::Stored;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  int block_size = 0;
};
struct WireBatch {
  double ts = 0;
  std::vector<WireEvent> events;
};

// Decodes one payload; nullopt (and `error` set) when it is not a well-formed
// EventBatch: wrong shapes, unknown tags, hashes that are not integers.
std::optional<WireBatch> decode_batch(const void* data, size_t size, std::string* error = nullptr);

}  // namespace kvs::events
