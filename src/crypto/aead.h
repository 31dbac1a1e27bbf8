// Authenticated encryption of a message with associated data:
// XChaCha20-Poly1305 (IETF), libsodium. The 24-byte nonce is random per
// message, which is safe for any number of messages under one key (that is
// why the X variant: 192-bit nonces make random collisions negligible).
//
// Sealed layout: nonce ‖ ciphertext ‖ tag. The associated data is not stored:
// the reader supplies it again, and open() fails unless it is byte-identical
// (this binds a ciphertext to its key, its model, its header).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "crypto/secret_key.h"

namespace kvs::crypto {

inline constexpr size_t kNonceBytes = 24, kTagBytes = 16;
inline constexpr size_t kSealOverhead = kNonceBytes + kTagBytes;

// Appends nonce ‖ ciphertext ‖ tag of `plain` to `out`.
void seal(const SecretKey& key, std::span<const uint8_t> plain, std::span<const uint8_t> ad, std::vector<uint8_t>& out);

// Decrypts `sealed` (as seal() wrote it) into `out`, which must hold exactly
// sealed.size() - kSealOverhead bytes. Returns false, leaving `out` zeroed,
// when the input is too short, was changed, or the key or the associated
// data differ: the caller cannot tell which, by design.
bool open(const SecretKey& key, std::span<const uint8_t> sealed, std::span<const uint8_t> ad, std::span<uint8_t> out);

}  // namespace kvs::crypto
