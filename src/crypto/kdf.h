// Subkeys from a master key: keyed BLAKE2b-256 (libsodium crypto_generichash)
// over a purpose label and a context, each length-prefixed. This is the
// construction libsodium's crypto_kdf uses, with a context of any length
// instead of an 8-byte one and a 64-bit id, so a subkey can be bound to a
// whole prefix-cache scope. Distinct (label, context) pairs give independent
// keys; a subkey reveals nothing about the master or its siblings.
#pragma once
#include <span>
#include <string_view>

#include "crypto/secret_key.h"

namespace kvs::crypto {

SecretKey derive_key(const SecretKey& master, std::string_view label, std::span<const uint8_t> context = {});

// Keyless BLAKE2b of `data` into `out` (1..64 bytes): fingerprints and file
// names that must not reveal their input.
void fingerprint(std::span<const uint8_t> data, std::span<uint8_t> out, std::string_view label);

}  // namespace kvs::crypto
