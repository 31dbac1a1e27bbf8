// Content addresses for full KV blocks (prefix caching).
//
// A full block's key is a hash chain:
//   key_i = SHA-256(key_{i-1} ‖ tokens of block i as int32 LE ‖ scope)
// with key_{-1} = 32 zero bytes. Because each key folds in its parent, equal
// keys mean equal *whole prefixes* (not just an equal block), so a block can
// be reused only by a sequence whose every earlier token is the same. The
// scope folds in who may see the block (tenant, permission version) and what
// computed it (model identity), so equal token prefixes from different scopes
// never share K/V. SHA-256 makes accidental or crafted collisions practically
// impossible; a cheaper non-cryptographic hash would let one tenant plant
// blocks that another tenant's prompt resolves to.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kvs {

using BlockKey = std::array<uint8_t, 32>;

// Opaque 32 bytes supplied by the caller (the server derives it from tenant +
// permission version); always made through make_scope so the model identity
// is part of it.
struct Scope {
  std::array<uint8_t, 32> bytes{};
  bool operator==(const Scope&) const = default;
};

// SHA-256 of a domain tag, the model identity and the caller's bytes, each
// length-prefixed (so ("ab","c") and ("a","bc") differ).
Scope make_scope(std::string_view model_identity, std::string_view caller_bytes = {});

// The key of one full block. `parent` is null for block 0. `tokens` holds
// exactly `block_size` ids.
BlockKey block_key(const BlockKey* parent, const int32_t* tokens, int block_size, const Scope& scope);

// The key of KV table `table`'s physical block (table > 0) for a logical
// block whose chain key is `chain_key`: SHA-256 of a domain tag, the chain
// key and the table index. Use it through kv/prefix_chain.h's table_key.
BlockKey table_block_key(const BlockKey& chain_key, int table);

// Lowercase hex of a key (logs, tests).
std::string to_hex(const BlockKey& k);

// Keys are already uniformly distributed: the first 8 bytes are a perfect
// hash-table hash.
struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const noexcept {
    uint64_t h;
    std::memcpy(&h, k.data(), sizeof h);
    return size_t(h);
  }
};

}  // namespace kvs
