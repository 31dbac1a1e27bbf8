// Reading a secret from a file only its owner may read: a key file, a
// password file. Whoever else can read it holds the secret too, so a file
// with group or other permission bits, owned by another user, a symbolic
// link or not a regular file is refused with the fix.
#pragma once
#include <stdexcept>
#include <string>

namespace kvs::crypto {

// Thrown for a key or secret file that must not be used; what() says why
// and what to do.
struct KeyFileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The first `max_bytes` of the owner-only regular file at `path`. `noun`
// names it in errors ("key file", "password file"); `fresh_hint` is added to
// the fixes (e.g. how to make a new one), may be empty.
std::string read_private_file(const std::string& path, const std::string& noun, size_t max_bytes,
                              const std::string& fresh_hint = "");

}  // namespace kvs::crypto
