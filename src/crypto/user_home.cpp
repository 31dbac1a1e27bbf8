#include "crypto/user_home.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace kvs::crypto {

std::string user_home(const std::string& what_to_pass) {
  if (const char* h = std::getenv("HOME"); h && *h) return h;
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &found) == 0 && found && found->pw_dir &&
      found->pw_dir[0] == '/')
    return found->pw_dir;
  throw std::runtime_error("HOME is not set and the account has no home folder: pass " + what_to_pass);
}

}  // namespace kvs::crypto
