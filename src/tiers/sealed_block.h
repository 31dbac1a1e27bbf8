// The bytes of one KV block as a lower tier keeps them: a plain header, then
// the block's K/V sealed with XChaCha20-Poly1305 (crypto/aead.h).
//
//   header (little endian, kHeaderBytes):
//     magic "KVSTIER1" | u32 version | u32 header bytes
//     identity fp [16]  model identity        -- a block of another model is a miss
//     layout fp [16]    KV type, block size, layers, heads, head dim
//     scope fp [16]     which scope sealed it (revokes, retention sweeps)
//     i64 created, i64 expires (unix seconds) | u64 payload bytes | 8 zero bytes
//   nonce [24] | ciphertext [payload bytes] | tag [16]
//
// The associated data is the whole header plus the block's chained key, so
// an entry copied under another name, with an edited expiry, or moved to
// another model fails to open. The key is the scope's own, derived from the
// server's master key (TierKeys), so one tenant's entries cannot be opened
// with another's key, and a revoked scope's entries with anyone's.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "crypto/secret_key.h"
#include "kv/prefix_hash.h"
#include "tiers/blob_store.h"

namespace kvs::tiers {

inline constexpr size_t kHeaderBytes = 96;
// Bytes of a sealed entry of a block of `block_bytes`: header, nonce, tag.
inline constexpr size_t sealed_bytes(size_t block_bytes) { return kHeaderBytes + 24 + block_bytes + 16; }

// What every entry of one server must match: the model and the KV layout.
struct TierIdentity {
  std::array<uint8_t, 16> model{};
  std::array<uint8_t, 16> layout{};
  size_t block_bytes = 0;
};
// `layout_desc`: the KV type, block size, layers, heads, head dim as text.
TierIdentity make_tier_identity(const std::string& model_identity, const std::string& layout_desc, size_t block_bytes);

struct EntryHeader {
  std::array<uint8_t, 16> model{}, layout{};
  ScopeFp scope{};
  int64_t created_unix = 0, expires_unix = 0;
  uint64_t payload_bytes = 0;
};

// Name of a block's entry in a store: hex of a fingerprint of its key and the
// identity (never the key itself, which the KV events publish).
std::string entry_id(const BlockKey& key, const TierIdentity& id);
// Lowercase hex of any bytes (entry ids, scope fingerprints in files and keys).
std::string hex(std::span<const uint8_t> bytes);
ScopeFp scope_fingerprint(const Scope& scope);

std::vector<uint8_t> seal_block(const crypto::SecretKey& scope_key, const BlockKey& key, const TierIdentity& id,
                                const EntryHeader& h, std::span<const uint8_t> block);

enum class OpenStatus { Ok, Corrupt, OtherModel, Expired, Forged };
const char* to_string(OpenStatus s);

// Parses the header only (store index rebuilds). False when it is not one.
bool parse_header(std::span<const uint8_t> blob, EntryHeader& h);
// Checks and decrypts an entry into `out` (id.block_bytes long).
OpenStatus open_block(const crypto::SecretKey& scope_key, const BlockKey& key, const TierIdentity& id,
                      std::span<const uint8_t> blob, int64_t now_unix, std::span<uint8_t> out);

}  // namespace kvs::tiers
