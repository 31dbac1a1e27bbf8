// libsodium must be initialised once before any call; every function of this
// module calls ensure_sodium() first. Throws std::runtime_error when the
// library cannot start (no entropy source).
#pragma once

namespace kvs::crypto {
void ensure_sodium();
}
