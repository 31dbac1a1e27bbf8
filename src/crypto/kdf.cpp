#include "crypto/kdf.h"

#include <sodium.h>

#include <array>
#include <stdexcept>

#include "crypto/sodium_init.h"

namespace kvs::crypto {

static void absorb(crypto_generichash_state& st, std::span<const uint8_t> bytes) {
  uint8_t len[8];
  uint64_t n = bytes.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  crypto_generichash_update(&st, len, sizeof len);
  crypto_generichash_update(&st, bytes.data(), bytes.size());
}

static std::span<const uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

SecretKey derive_key(const SecretKey& master, std::string_view label, std::span<const uint8_t> context) {
  ensure_sodium();
  crypto_generichash_state st;
  crypto_generichash_init(&st, master.data(), kKeyBytes, kKeyBytes);
  absorb(st, as_bytes("kvserve-kdf-v1"));
  absorb(st, as_bytes(label));
  absorb(st, context);
  std::array<uint8_t, kKeyBytes> out{};
  crypto_generichash_final(&st, out.data(), out.size());
  sodium_memzero(&st, sizeof st);
  SecretKey k{std::span<const uint8_t>(out)};
  sodium_memzero(out.data(), out.size());
  return k;
}

void fingerprint(std::span<const uint8_t> data, std::span<uint8_t> out, std::string_view label) {
  ensure_sodium();
  if (out.empty() || out.size() > crypto_generichash_BYTES_MAX) throw std::invalid_argument("fingerprint: bad length");
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, out.size());
  absorb(st, as_bytes(label));
  absorb(st, data);
  crypto_generichash_final(&st, out.data(), out.size());
}

}  // namespace kvs::crypto
