#include "crypto/sodium_init.h"

#include <sodium.h>

#include <stdexcept>

namespace kvs::crypto {

void ensure_sodium() {
  // sodium_init is thread-safe and idempotent; the static makes the check one load after the first call.
  static const int rc = sodium_init();
  if (rc < 0) throw std::runtime_error("libsodium failed to initialise (no system entropy source?)");
}

}  // namespace kvs::crypto
