#include "chat/session_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "crypto/aead.h"
#include "crypto/kdf.h"
#include "crypto/secret_key.h"
#include "crypto/user_home.h"

namespace kvs::chat {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'S', 'E', 'S', 'S', '1'};
constexpr uint8_t kModeKeyFile = 1, kModePassphrase = 2;
constexpr size_t kHeaderBytes = sizeof kMagic + 1 + crypto::kSaltBytes + 16;

struct Header {
  uint8_t mode = 0;
  std::array<uint8_t, crypto::kSaltBytes> salt{};
  uint64_t ops = 0, mem = 0;
};

void put_u64(std::vector<uint8_t>& o, uint64_t v) {
  for (int i = 0; i < 8; ++i) o.push_back(uint8_t(v >> (8 * i)));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

std::vector<uint8_t> encode_header(const Header& h) {
  std::vector<uint8_t> o(kMagic, kMagic + sizeof kMagic);
  o.push_back(h.mode);
  o.insert(o.end(), h.salt.begin(), h.salt.end());
  put_u64(o, h.ops);
  put_u64(o, h.mem);
  return o;
}

// Header bytes ‖ model identity ‖ session name, each length-prefixed.
std::vector<uint8_t> associated(const std::vector<uint8_t>& header, const std::string& model, const std::string& name) {
  std::vector<uint8_t> ad = header;
  for (const std::string* s : {&model, &name}) {
    put_u64(ad, s->size());
    ad.insert(ad.end(), s->begin(), s->end());
  }
  return ad;
}

// Overwrites a file's bytes before it is unlinked (best effort).
void shred(const fs::path& p) {
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  if (!ec) {
    std::ofstream f(p, std::ios::binary | std::ios::in | std::ios::out);
    const std::vector<char> zeros(4096, 0);
    for (uintmax_t done = 0; f && done < size; done += zeros.size())
      f.write(zeros.data(), std::streamsize(std::min<uintmax_t>(zeros.size(), size - done)));
    f.flush();
  }
  fs::remove(p, ec);
}

std::string quoted(const std::string& name) { return "session '" + name + "'"; }

// What crypto::load_or_create_key_file writes: a regular file of 64 hex
// characters and a newline (trailing whitespace tolerated, as when read).
bool looks_like_key_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(p, ec))) return false;
  const auto size = fs::file_size(p, ec);
  if (ec || size < 2 * crypto::kKeyBytes || size > 2 * crypto::kKeyBytes + 4) return false;
  std::ifstream f(p, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  if (text.size() != size) return false;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (i < 2 * crypto::kKeyBytes ? !std::isxdigit(c) : !std::isspace(c)) return false;
  }
  return true;
}

// A file this store wrote: a fingerprint in hex, ".kvs", maybe ".tmp".
bool ours(const fs::path& p) {
  std::string n = p.filename().string();
  if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) n.resize(n.size() - 4);
  if (n.size() != 32 + 4 || n.compare(32, 4, ".kvs") != 0) return false;
  return std::all_of(n.begin(), n.begin() + 32, [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

}  // namespace

std::string check_session_folder(const std::string& dir) {
  std::error_code ec;
  fs::path at = fs::absolute(dir, ec);
  // A folder not made yet is made at the first /save: its nearest existing
  // parent must take it.
  while (!fs::exists(fs::symlink_status(at, ec)) && at.has_parent_path() && at != at.parent_path()) at = at.parent_path();
  if (!fs::is_directory(at, ec))
    throw SessionError("--session-dir " + dir + ": " + at.string() + " is not a folder; give a folder (new or existing)");
  if (at == fs::absolute(dir, ec)) {
    // Probed by creating a file: access() says yes to root on an immutable folder.
    std::string probe = (at / ".kvserve-probe-XXXXXX").string();
    const int fd = ::mkstemp(probe.data());
    if (fd < 0)
      throw SessionError("--session-dir " + dir + ": cannot write in it (" + std::strerror(errno) +
                         "); give a folder you can write to");
    ::close(fd);
    ::unlink(probe.c_str());
    struct stat st{};
    if (::stat(at.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
      return "--session-dir " + dir + " has mode " + mode + ": others can list which sessions exist (the files " +
             "themselves are 0600); `chmod 700 " + dir + "` to stop that";
    }
  } else if (::access(at.c_str(), W_OK | X_OK) != 0) {
    throw SessionError("--session-dir " + dir + ": cannot create it in " + at.string() + " (" + std::strerror(errno) +
                       "); give a folder you can write to");
  }
  return "";
}

std::string default_session_dir() {
  if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x) return std::string(x) + "/kvserve/sessions";
  return crypto::user_home("--session-dir") + "/.local/share/kvserve/sessions";
}

SessionStore::SessionStore(std::string dir, SessionKeying keying, std::string model_identity)
    : dir_(std::move(dir)), model_(std::move(model_identity)), k_(std::move(keying)) {
  if (k_.key_file.empty()) k_.key_file = (fs::path(dir_) / "session.key").string();
}

std::string SessionStore::path_of(const std::string& name) const {
  std::array<uint8_t, 16> fp{};
  crypto::fingerprint({reinterpret_cast<const uint8_t*>(name.data()), name.size()}, fp, "kvserve-session-name");
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : fp) s += {hex[b >> 4], hex[b & 15]};
  return (fs::path(dir_) / (s + ".kvs")).string();
}

void SessionStore::save(const std::string& name, const std::vector<uint8_t>& snapshot) {
  // Only a folder made here is narrowed to its owner: --session-dir may name
  // an existing folder whose mode is not ours to change.
  if (fs::create_directories(dir_)) fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::replace);
  Header h;
  h.salt = crypto::random_salt();
  crypto::SecretKey key;
  if (k_.passphrase.empty()) {
    h.mode = kModeKeyFile;
    key = crypto::derive_key(crypto::load_or_create_key_file(k_.key_file), "chat-session", h.salt);
  } else {
    h.mode = kModePassphrase;
    h.ops = k_.pwhash.opslimit;
    h.mem = k_.pwhash.memlimit;
    key = crypto::key_from_passphrase(k_.passphrase, h.salt, k_.pwhash);
  }
  std::vector<uint8_t> out = encode_header(h);
  crypto::seal(key, snapshot, associated(out, model_, name), out);
  const std::string path = path_of(name), tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw SessionError("cannot write " + quoted(name) + " in " + dir_ + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t w = ::write(fd, out.data() + done, out.size() - done);
    if (w <= 0) break;
    done += size_t(w);
  }
  const bool ok = done == out.size() && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw SessionError("cannot write " + quoted(name) + " in " + dir_);
  }
}

std::vector<uint8_t> SessionStore::load(const std::string& name) const {
  const std::string path = path_of(name);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw SessionError("no saved " + quoted(name) + " in " + dir_);
  const std::vector<uint8_t> in((std::istreambuf_iterator<char>(f)), {});
  if (in.size() < kHeaderBytes + crypto::kSealOverhead)
    throw SessionError(quoted(name) + " is truncated (" + std::to_string(in.size()) + " bytes)");
  if (std::memcmp(in.data(), kMagic, sizeof kMagic) != 0) throw SessionError(quoted(name) + " is not a kvserve session file");
  Header h;
  h.mode = in[sizeof kMagic];
  std::memcpy(h.salt.data(), in.data() + sizeof kMagic + 1, h.salt.size());
  h.ops = get_u64(in.data() + sizeof kMagic + 1 + h.salt.size());
  h.mem = get_u64(in.data() + sizeof kMagic + 9 + h.salt.size());
  crypto::SecretKey key;
  if (h.mode == kModeKeyFile) {
    if (!k_.passphrase.empty()) throw SessionError(quoted(name) + " was saved with the key file, not a passphrase");
    key = crypto::derive_key(crypto::load_key_file(k_.key_file), "chat-session", h.salt);
  } else if (h.mode == kModePassphrase) {
    if (k_.passphrase.empty()) throw SessionError(quoted(name) + " is protected by a passphrase: pass --passphrase-env VAR with the passphrase in $VAR");
    try {
      key = crypto::key_from_passphrase(k_.passphrase, h.salt, {h.ops, h.mem});
    } catch (const std::invalid_argument&) {
      throw SessionError(quoted(name) + " has a damaged header");
    }
  } else {
    throw SessionError(quoted(name) + " has a damaged header");
  }
  const std::vector<uint8_t> header(in.begin(), in.begin() + long(kHeaderBytes));
  const std::span<const uint8_t> sealed(in.data() + kHeaderBytes, in.size() - kHeaderBytes);
  std::vector<uint8_t> plain(sealed.size() - crypto::kSealOverhead);
  if (!crypto::open(key, sealed, associated(header, model_, name), plain))
    throw SessionError("cannot decrypt " + quoted(name) +
                       ": wrong key or passphrase, another model, or the file was changed or truncated");
  return plain;
}

int SessionStore::wipe() {
  std::error_code ec;
  // Refuse before deleting anything: a mistyped path must not destroy a
  // user's file (fs::remove would delete a regular file named as the folder).
  if (fs::exists(fs::symlink_status(dir_, ec)) && !fs::is_directory(dir_, ec))
    throw SessionError("session folder " + dir_ + " is not a directory; nothing was deleted (check --session-dir)");
  const bool has_key = fs::exists(fs::symlink_status(k_.key_file, ec));
  if (has_key && !looks_like_key_file(k_.key_file))
    throw SessionError("key file " + k_.key_file + " is not a kvserve session key (64 hex characters and a newline); "
                       "nothing was deleted (check --key-file)");
  std::vector<fs::path> victims;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (ours(e.path())) victims.push_back(e.path());
  if (has_key) victims.push_back(k_.key_file);
  // The folder's own key encrypted its sessions whatever --key-file named:
  // shredding rests on it going too.
  const fs::path own = fs::path(dir_) / "session.key";
  if (own != fs::path(k_.key_file) && fs::exists(fs::symlink_status(own, ec)) && looks_like_key_file(own))
    victims.push_back(own);
  int n = 0;
  for (const auto& p : victims) {
    shred(p);
    ++n;
  }
  ::rmdir(dir_.c_str());  // removes only an empty directory, never a file
  return n;
}

}  // namespace kvs::chat
