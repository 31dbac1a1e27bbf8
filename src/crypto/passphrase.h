// A key from a passphrase: Argon2id (libsodium crypto_pwhash), memory-hard so
// that guessing a short passphrase offline costs real memory and time per
// guess. The salt is random per file and stored beside the ciphertext, in
// clear, with the cost parameters; none of them is secret.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

#include "crypto/secret_key.h"

namespace kvs::crypto {

inline constexpr size_t kSaltBytes = 16;

struct PwhashParams {
  uint64_t opslimit = 0;  // passes; 0 = libsodium's "interactive" preset
  uint64_t memlimit = 0;  // bytes; 0 = libsodium's "interactive" preset
  static PwhashParams interactive();
  static PwhashParams minimum();  // the cheapest Argon2id allows (tests)
};

std::array<uint8_t, kSaltBytes> random_salt();

// Throws std::invalid_argument for an empty passphrase or parameters outside
// libsodium's bounds, std::runtime_error when the memory cannot be had.
SecretKey key_from_passphrase(std::string_view passphrase, const std::array<uint8_t, kSaltBytes>& salt,
                              const PwhashParams& p);

}  // namespace kvs::crypto
