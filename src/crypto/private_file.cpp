#include "crypto/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace kvs::crypto {

namespace {

// Closes the descriptor on every path out, the throwing ones included.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string with_fresh(const std::string& fresh_hint) { return fresh_hint.empty() ? "" : ", " + fresh_hint; }

}  // namespace

std::string read_private_file(const std::string& path, const std::string& noun, size_t max_bytes,
                              const std::string& fresh_hint) {
  const Fd f{::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC)};
  if (f.fd < 0 && errno == ELOOP) {
    // A link is not followed (whoever can change it could point us at
    // another file): say so, and where it points.
    std::error_code ec;
    const std::string to = std::filesystem::read_symlink(path, ec).string();
    throw KeyFileError(noun + " " + path + " is a symbolic link" + (to.empty() ? "" : " to " + to) +
                       "; give the path of the file itself");
  }
  if (f.fd < 0) throw KeyFileError("cannot open " + noun + " " + path + ": " + std::strerror(errno));
  struct stat st{};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) throw KeyFileError(noun + " " + path + " is not a regular file");
  // The owner first: chmod alone cannot fix another user's file.
  if (st.st_uid != ::geteuid())
    throw KeyFileError(noun + " " + path + " is owned by uid " + std::to_string(st.st_uid) + ", not by the server's uid " +
                       std::to_string(::geteuid()) + "; fix it with `chown " + std::to_string(::geteuid()) + " " +
                       path + "` and `chmod 600 " + path + "`" + with_fresh(fresh_hint));
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    throw KeyFileError(noun + " " + path + " has mode " + mode + ": group or others may read it; fix it with `chmod 600 " +
                       path + "`" + with_fresh(fresh_hint));
  }
  std::string text(size_t(std::min<off_t>(st.st_size, off_t(max_bytes))), '\0');
  const ssize_t got = ::read(f.fd, text.data(), text.size());
  if (got < 0) throw KeyFileError("cannot read " + noun + " " + path + ": " + std::strerror(errno));
  text.resize(size_t(got));
  return text;
}

}  // namespace kvs::crypto
