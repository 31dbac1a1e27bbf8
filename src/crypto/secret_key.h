// A 32-byte secret key held in memory that is locked (never swapped) and
// wiped when the key goes away; read from or created as a key file.
//
// Key file format: 64 lowercase hex characters and a newline. The file must
// be a regular file owned by the server's user with no group or other
// permission bits (0600 or 0400); anything else is refused with a message
// that says how to fix it, because a world-readable master key makes the
// encryption of everything derived from it pointless.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "crypto/private_file.h"

namespace kvs::crypto {

inline constexpr size_t kKeyBytes = 32;

class SecretKey {
 public:
  SecretKey();  // all zero
  explicit SecretKey(std::span<const uint8_t> bytes);  // throws std::invalid_argument unless kKeyBytes
  ~SecretKey();
  SecretKey(const SecretKey& o);
  SecretKey& operator=(const SecretKey& o);

  static SecretKey random();
  const uint8_t* data() const { return bytes_->data(); }
  std::span<const uint8_t> span() const { return {bytes_->data(), kKeyBytes}; }

 private:
  // Heap-held so the locked page never moves with the object.
  std::unique_ptr<std::array<uint8_t, kKeyBytes>> bytes_;
};

// Reads the key at `path`; when the file does not exist, creates it (mode
// 0600, O_EXCL) with a fresh random key. `created` (optional) says which.
SecretKey load_or_create_key_file(const std::string& path, bool* created = nullptr);
// Reads an existing key file (same checks); throws KeyFileError.
SecretKey load_key_file(const std::string& path);

}  // namespace kvs::crypto
