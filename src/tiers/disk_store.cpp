#include "tiers/disk_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "tiers/sealed_block.h"

namespace fs = std::filesystem;

namespace kvs::tiers {

static bool parse_hex(const std::string& s, ScopeFp& fp) {
  if (s.size() != 32) return false;
  for (size_t i = 0; i < 16; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) return false;
    fp[i] = uint8_t(v);
  }
  return true;
}

static bool is_hex(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

static bool valid_id(const std::string& id) { return id.size() >= 4 && id.size() <= 64 && is_hex(id); }

// A name this store writes: a shard folder's entries and their temporaries.
static bool own_entry_name(const std::string& name) {
  std::string stem = name;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".tmp") == 0) stem.resize(stem.size() - 4);
  if (stem.size() <= 4 || stem.compare(stem.size() - 4, 4, ".kvb") != 0) return false;
  return valid_id(stem.substr(0, stem.size() - 4));
}

// The first thing in DIR this store did not write ("" when none): the
// folder holds only shard folders of entries, the revoked list and the
// marker, or it is not a tier and nothing in it may be touched.
static std::string foreign_entry(const std::string& dir) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "revoked" || name == "key-id" || name == DiskStore::kMarker) continue;
    if (!(it->is_directory(ec) && !it->is_symlink(ec) && name.size() == 2 && is_hex(name))) return it->path().string();
    for (auto in = fs::directory_iterator(it->path(), ec); !ec && in != fs::directory_iterator(); in.increment(ec))
      if (!in->is_regular_file(ec) || in->is_symlink(ec) || !own_entry_name(in->path().filename().string()))
        return in->path().string();
  }
  if (ec) return dir + " (unreadable: " + ec.message() + ")";
  return "";
}

DiskStore::DiskStore(std::string dir, int64_t capacity_bytes, int64_t now_unix, Log log)
    : dir_(std::move(dir)), capacity_(capacity_bytes), log_(std::move(log)) {
  std::error_code ec;
  if (fs::exists(dir_, ec) && !fs::is_directory(dir_, ec))
    throw std::runtime_error("--kv-disk: " + dir_ + " exists and is not a directory; give a folder");
  fs::create_directories(dir_, ec);
  if (ec) throw std::runtime_error("--kv-disk: cannot create " + dir_ + ": " + ec.message());
  // Start-up deletes stray, expired and unreadable entries: only ever in a
  // folder that holds nothing else (a typo like --kv-disk ~ must not cost
  // the user a file, nor the folder its permissions).
  if (const std::string other = foreign_entry(dir_); !other.empty())
    throw std::runtime_error("--kv-disk: " + dir_ + " is not a kvserve tier folder: it holds '" + other +
                             "', which kvserve did not write; give an empty or new folder");
  lock_folder();
  ::chmod(dir_.c_str(), 0700);
  if (::access(dir_.c_str(), R_OK | W_OK | X_OK) != 0)
    throw std::runtime_error("--kv-disk: " + dir_ + " is not a writable directory: " + std::strerror(errno));
  load_revoked();
  scan(now_unix);
}

// One line per outage (until a write succeeds again), with the path and
// the errno that failed; every failure is counted by the tier set.
PutStatus DiskStore::write_failed(const std::string& path, int err) {
  if (!write_failing_)
    log("kv tier disk: cannot write " + path + ": " + std::strerror(err) +
        " (blocks stay in RAM only until a write succeeds; errors counted in kvserve_kv_tier_errors_total)");
  write_failing_ = true;
  return PutStatus::Failed;
}

DiskStore::~DiskStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

// Two servers on one folder would each index only its own writes, overrun
// the size bound together, and delete the other's files at start.
void DiskStore::lock_folder() {
  const std::string marker = dir_ + "/" + kMarker;
  lock_fd_ = ::open(marker.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) throw std::runtime_error("--kv-disk: cannot create " + marker + ": " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw std::runtime_error("--kv-disk: " + dir_ + " is in use by another kvserve; each server needs its own " +
                             "folder (servers share blocks through --kv-redis)");
  }
  static const char kText[] = "kvserve disk KV tier: entries in <2 hex>/<id>.kvb, revoked scopes in 'revoked'\n";
  if (::lseek(lock_fd_, 0, SEEK_END) == 0 && ::write(lock_fd_, kText, sizeof kText - 1) < 0) {
    // A marker without its text still locks; the folder works.
  }
}

std::string DiskStore::path_of(const std::string& id) const { return dir_ + "/" + id.substr(0, 2) + "/" + id + ".kvb"; }

// A list that cannot be read or written would let a revoke be forgotten:
// anything but a file is refused, lines that are not fingerprints are said.
void DiskStore::load_revoked() {
  const std::string path = dir_ + "/revoked";
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw std::runtime_error("--kv-disk: " + path + " is not a file; it is where the tier lists revoked scopes: " +
                             "move it out of the folder");
  std::ifstream in(path);
  std::string line;
  ScopeFp fp;
  int64_t bad = 0;
  while (std::getline(in, line)) {
    if (parse_hex(line, fp))
      revoked_.insert(fp);
    else
      bad += !line.empty();
  }
  if (bad > 0)
    log("kv tier disk: " + path + ": " + std::to_string(bad) + " lines are not revoked-scope fingerprints " +
        "(damaged or edited) and are ignored; revokes recorded there may be lost: revoke those tenants again");
}

// Rebuilds the index from the files' headers: stray temporaries, unreadable
// or foreign files, expired and revoked entries are deleted.
void DiskStore::scan(int64_t now_unix) {
  struct Found {
    std::string id;
    Entry e;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  std::error_code ec;
  int64_t dropped = 0;
  for (auto it = fs::recursive_directory_iterator(dir_, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file() || it.depth() != 1) continue;
    const fs::path p = it->path();
    const std::string id = p.stem().string();
    EntryHeader h;
    std::vector<uint8_t> head(kHeaderBytes);
    std::ifstream f(p, std::ios::binary);
    if (!own_entry_name(p.filename().string())) continue;  // never another's file (foreign_entry refused them)
    const bool ok = p.extension() == ".kvb" && valid_id(id) &&
                    f.read(reinterpret_cast<char*>(head.data()), std::streamsize(head.size())) && parse_header(head, h) &&
                    h.expires_unix > now_unix && !revoked_.count(h.scope);
    if (!ok) {
      fs::remove(p, ec);
      ++dropped;
      continue;
    }
    Found fnd{id, {}, it->last_write_time(ec)};
    fnd.e.bytes = int64_t(it->file_size(ec));
    fnd.e.scope = h.scope;
    fnd.e.expires = h.expires_unix;
    fnd.e.created = h.created_unix;
    found.push_back(std::move(fnd));
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (Found& f : found) {
    lru_.push_back(f.id);
    f.e.lru = std::prev(lru_.end());
    bytes_ += f.e.bytes;
    index_.emplace(f.id, f.e);
  }
  int64_t over = 0;  // a smaller --kv-disk-size than the last run's
  for (; bytes_ > capacity_ && !lru_.empty(); ++over) remove(lru_.front());
  if (!index_.empty() || dropped || over)
    log("kv tier disk: " + std::to_string(index_.size()) + " entries (" + std::to_string(bytes_.load()) +
        " bytes) from a previous run in " + dir_ +
        (dropped ? ", " + std::to_string(dropped) + " expired, revoked or unreadable files deleted" : "") +
        (over ? ", " + std::to_string(over) + " least recently used deleted to fit --kv-disk-size" : ""));
}

void DiskStore::remove(const std::string& id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  ::unlink(path_of(id).c_str());
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
}

int64_t DiskStore::cap_retention(double max_s, int64_t now_unix) {
  std::vector<std::string> gone;
  for (auto& [id, e] : index_) {
    e.expires = std::min<int64_t>(e.expires, e.created + int64_t(max_s));
    if (e.expires <= now_unix) gone.push_back(id);
  }
  for (const auto& id : gone) remove(id);
  if (!gone.empty())
    log("kv tier disk: " + std::to_string(gone.size()) + " entries written under a longer retention deleted (the " +
        "retention now is " + std::to_string(int64_t(max_s)) + " s)");
  return int64_t(gone.size());
}

void DiskStore::note_key(const std::string& key_id) {
  const std::string path = dir_ + "/key-id";
  std::string before;
  std::getline(std::ifstream(path), before);
  if (!before.empty() && before != key_id && !index_.empty())
    log("kv tier disk: the " + std::to_string(index_.size()) + " entries in " + dir_ +
        " were written under another master key (--kv-key-file): they cannot be read and will expire; start with "
        "the key they were written under to serve them");
  if (before != key_id) std::ofstream(path, std::ios::trunc) << key_id << "\n";
}

void DiskStore::touch(const std::string& id) {
  if (auto it = index_.find(id); it != index_.end()) lru_.splice(lru_.end(), lru_, it->second.lru);
}

PutStatus DiskStore::put(const std::string& id, std::span<const uint8_t> blob, const BlobMeta& meta) {
  if (!valid_id(id)) throw std::invalid_argument("disk tier: bad entry id");
  if (revoked_.count(meta.scope)) {
    // The revoke outlives a restart here (DIR/revoked), while the keys file
    // may bring the scope back: say once why its writes fail.
    if (said_revoked_.insert(meta.scope).second)
      log("kv tier disk: not storing for a prefix scope revoked earlier (listed in " + dir_ +
          "/revoked): raise the tenant's permission_version in --api-keys to store for it again");
    return PutStatus::Failed;
  }
  // A chain's block goes just before its parent in the LRU order, so the
  // chain's tail is evicted before its head: a block is of use only after
  // every block before it (at the most recent end, a full tier dropped
  // heads first and kept tails no prompt could reach).
  auto at = lru_.end();
  bool orphan = false;  // its parent is not here: no read of this store alone reaches it
  if (!meta.parent.empty()) {
    if (auto p = index_.find(meta.parent); p != index_.end()) at = p->second.lru;
    else orphan = true;
  }
  if (auto it = index_.find(id); it != index_.end()) {
    if (it->second.lru != at) lru_.splice(at, lru_, it->second.lru);
    return PutStatus::Exists;
  }
  const int64_t size = int64_t(blob.size());
  if (size > capacity_) return PutStatus::NoRoom;
  if (orphan && bytes_ + size > capacity_) return PutStatus::Skipped;  // not worth another's entry
  while (bytes_ + size > capacity_ && !lru_.empty()) {
    if (lru_.begin() == at) return PutStatus::Skipped;  // it would be the first out: keep the parent
    remove(lru_.front());
    ++evictions_;
  }
  const std::string path = path_of(id), tmp = path + ".tmp";
  const std::string shard = dir_ + "/" + id.substr(0, 2);
  if (::mkdir(shard.c_str(), 0700) != 0 && errno != EEXIST) return write_failed(shard, errno);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  for (size_t done = 0; ok && done < blob.size();) {
    const ssize_t w = ::write(fd, blob.data() + done, blob.size() - done);
    if (w <= 0) ok = false;
    else done += size_t(w);
  }
  int err = ok ? 0 : errno;
  if (fd >= 0 && ::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return write_failed(tmp, err);
  }
  write_failing_ = false;
  index_.emplace(id, Entry{size, meta.scope, meta.expires_unix, lru_.insert(at, id), int64_t(std::time(nullptr))});
  bytes_ += size;
  return PutStatus::Stored;
}

GetStatus DiskStore::get(const std::string& id, std::vector<uint8_t>& out) {
  auto it = index_.find(id);
  if (it == index_.end()) return GetStatus::Miss;
  if (it->second.expires <= int64_t(std::time(nullptr))) {  // expired by a shorter retention (cap_retention)
    remove(id);
    return GetStatus::Miss;
  }
  out.resize(size_t(it->second.bytes));
  std::ifstream f(path_of(id), std::ios::binary);
  if (!f.read(reinterpret_cast<char*>(out.data()), std::streamsize(out.size())) || f.peek() != EOF) {
    log("kv tier disk: entry " + id.substr(0, 8) + "… is unreadable or changed size; deleted");
    remove(id);
    return GetStatus::Failed;
  }
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return GetStatus::Hit;
}

void DiskStore::erase(const std::string& id) { remove(id); }

int64_t DiskStore::erase_scope(const ScopeFp& scope) {
  if (revoked_.insert(scope).second) {
    std::ofstream f(dir_ + "/revoked", std::ios::app);
    f << hex(scope) << "\n";
    f.flush();
    if (!f)
      log("kv tier disk: cannot append to " + dir_ + "/revoked: " + std::strerror(errno) +
          "; the revoke holds until a restart only");
  }
  std::vector<std::string> ids;
  for (const auto& [id, e] : index_)
    if (e.scope == scope) ids.push_back(id);
  for (const auto& id : ids) remove(id);
  return int64_t(ids.size());
}

int64_t DiskStore::sweep_expired(int64_t now_unix) {
  std::vector<std::string> ids;
  for (const auto& [id, e] : index_)
    if (e.expires <= now_unix) ids.push_back(id);
  for (const auto& id : ids) remove(id);
  return int64_t(ids.size());
}

}  // namespace kvs::tiers
