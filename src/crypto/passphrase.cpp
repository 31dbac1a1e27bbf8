#include "crypto/passphrase.h"

#include <sodium.h>

#include <stdexcept>

#include "crypto/sodium_init.h"

namespace kvs::crypto {

PwhashParams PwhashParams::interactive() {
  return {crypto_pwhash_OPSLIMIT_INTERACTIVE, crypto_pwhash_MEMLIMIT_INTERACTIVE};
}

PwhashParams PwhashParams::minimum() { return {crypto_pwhash_OPSLIMIT_MIN, crypto_pwhash_MEMLIMIT_MIN}; }

std::array<uint8_t, kSaltBytes> random_salt() {
  ensure_sodium();
  std::array<uint8_t, kSaltBytes> s{};
  randombytes_buf(s.data(), s.size());
  return s;
}

SecretKey key_from_passphrase(std::string_view pass, const std::array<uint8_t, kSaltBytes>& salt,
                              const PwhashParams& p0) {
  ensure_sodium();
  static_assert(kSaltBytes == crypto_pwhash_SALTBYTES);
  if (pass.empty()) throw std::invalid_argument("the passphrase is empty");
  PwhashParams p = p0;
  if (p.opslimit == 0) p.opslimit = crypto_pwhash_OPSLIMIT_INTERACTIVE;
  if (p.memlimit == 0) p.memlimit = crypto_pwhash_MEMLIMIT_INTERACTIVE;
  if (p.opslimit < crypto_pwhash_OPSLIMIT_MIN || p.opslimit > crypto_pwhash_OPSLIMIT_MAX ||
      p.memlimit < crypto_pwhash_MEMLIMIT_MIN || p.memlimit > crypto_pwhash_MEMLIMIT_MAX)
    throw std::invalid_argument("Argon2id cost parameters out of range");
  std::array<uint8_t, kKeyBytes> out{};
  if (crypto_pwhash(out.data(), out.size(), pass.data(), pass.size(), salt.data(), p.opslimit, size_t(p.memlimit),
                    crypto_pwhash_ALG_ARGON2ID13) != 0)
    throw std::runtime_error("Argon2id could not get its memory");
  SecretKey k{std::span<const uint8_t>(out)};
  sodium_memzero(out.data(), out.size());
  return k;
}

}  // namespace kvs::crypto
