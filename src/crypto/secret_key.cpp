#include "crypto/secret_key.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "crypto/sodium_init.h"

namespace kvs::crypto {

SecretKey::SecretKey() : bytes_(std::make_unique<std::array<uint8_t, kKeyBytes>>()) {
  ensure_sodium();
  bytes_->fill(0);
  sodium_mlock(bytes_->data(), kKeyBytes);  // best effort: RLIMIT_MEMLOCK may forbid it
}

SecretKey::SecretKey(std::span<const uint8_t> bytes) : SecretKey() {
  if (bytes.size() != kKeyBytes)
    throw std::invalid_argument("secret key must be " + std::to_string(kKeyBytes) + " bytes, got " +
                                std::to_string(bytes.size()));
  std::memcpy(bytes_->data(), bytes.data(), kKeyBytes);
}

SecretKey::~SecretKey() {
  if (bytes_) sodium_munlock(bytes_->data(), kKeyBytes);  // zeroes the bytes, then unlocks
}

SecretKey::SecretKey(const SecretKey& o) : SecretKey(o.span()) {}

SecretKey& SecretKey::operator=(const SecretKey& o) {
  if (this != &o) std::memcpy(bytes_->data(), o.data(), kKeyBytes);
  return *this;
}

SecretKey SecretKey::random() {
  SecretKey k;
  randombytes_buf(k.bytes_->data(), kKeyBytes);
  return k;
}

static SecretKey parse_key_text(const std::string& text, const std::string& path) {
  std::string hex = text;
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r' || hex.back() == ' ')) hex.pop_back();
  std::array<uint8_t, kKeyBytes> raw{};
  size_t len = 0;
  const char* end = nullptr;
  if (hex.size() != 2 * kKeyBytes ||
      sodium_hex2bin(raw.data(), raw.size(), hex.data(), hex.size(), nullptr, &len, &end) != 0 || len != kKeyBytes)
    throw KeyFileError("key file " + path + " does not hold a key (expected " + std::to_string(2 * kKeyBytes) +
                       " hex characters); it is not a kvserve key file or it was damaged");
  SecretKey k{std::span<const uint8_t>(raw)};
  sodium_memzero(raw.data(), raw.size());
  return k;
}

SecretKey load_key_file(const std::string& path) {
  ensure_sodium();
  std::string text = read_private_file(path, "key file", 256, "or point the flag at a new path to create a fresh key");
  SecretKey k = parse_key_text(text, path);
  sodium_memzero(text.data(), text.size());
  return k;
}

SecretKey load_or_create_key_file(const std::string& path, bool* created) {
  ensure_sodium();
  if (created) *created = false;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return load_key_file(path);
    const int err = errno;
    const std::string dir = std::filesystem::path(path).parent_path().string();
    // The folder is not made here: a typo in it would go unnoticed.
    if (err == ENOENT && !dir.empty() && !std::filesystem::exists(dir))
      throw KeyFileError("cannot create key file " + path + ": the folder " + dir + " does not exist; create it (`mkdir -p " +
                         dir + "`) or give a path in an existing folder");
    throw KeyFileError("cannot create key file " + path + ": " + std::strerror(err));
  }
  SecretKey k = SecretKey::random();
  std::string hex(2 * kKeyBytes + 1, '\0');
  sodium_bin2hex(hex.data(), hex.size(), k.data(), kKeyBytes);
  hex.back() = '\n';
  const bool ok = ::write(fd, hex.data(), hex.size()) == ssize_t(hex.size()) && ::fsync(fd) == 0;
  sodium_memzero(hex.data(), hex.size());
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    throw KeyFileError("cannot write key file " + path + ": " + std::strerror(errno));
  }
  if (created) *created = true;
  return k;
}

}  // namespace kvs::crypto
