#include "crypto/aead.h"

#include <sodium.h>

#include <cstring>
#include <stdexcept>

#include "crypto/sodium_init.h"

namespace kvs::crypto {

static_assert(kNonceBytes == crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
static_assert(kTagBytes == crypto_aead_xchacha20poly1305_ietf_ABYTES);
static_assert(kKeyBytes == crypto_aead_xchacha20poly1305_ietf_KEYBYTES);

void seal(const SecretKey& key, std::span<const uint8_t> plain, std::span<const uint8_t> ad, std::vector<uint8_t>& out) {
  ensure_sodium();
  const size_t at = out.size();
  out.resize(at + plain.size() + kSealOverhead);
  uint8_t* nonce = out.data() + at;
  randombytes_buf(nonce, kNonceBytes);
  unsigned long long clen = 0;
  if (crypto_aead_xchacha20poly1305_ietf_encrypt(nonce + kNonceBytes, &clen, plain.data(), plain.size(), ad.data(),
                                                 ad.size(), nullptr, nonce, key.data()) != 0 ||
      clen != plain.size() + kTagBytes)
    throw std::runtime_error("XChaCha20-Poly1305 encryption failed");
}

bool open(const SecretKey& key, std::span<const uint8_t> sealed, std::span<const uint8_t> ad, std::span<uint8_t> out) {
  ensure_sodium();
  if (sealed.size() < kSealOverhead || out.size() != sealed.size() - kSealOverhead) {
    std::memset(out.data(), 0, out.size());
    return false;
  }
  unsigned long long mlen = 0;
  const int rc = crypto_aead_xchacha20poly1305_ietf_decrypt(out.data(), &mlen, nullptr, sealed.data() + kNonceBytes,
                                                            sealed.size() - kNonceBytes, ad.data(), ad.size(),
                                                            sealed.data(), key.data());
  if (rc != 0 || mlen != out.size()) {
    std::memset(out.data(), 0, out.size());
    return false;
  }
  return true;
}

}  // namespace kvs::crypto
