// The disk tier's storage: one file per block entry,
//   DIR/<first two hex chars of the id>/<id>.kvb
// written to a temporary name and renamed into place, so a reader never sees
// half a file (a crash leaves a stray .tmp, deleted at the next start). An
// in-memory index (id -> size, scope, expiry, LRU position) is rebuilt at
// start from the files' plain headers, which is what makes the tier survive
// restarts. Capacity is a byte bound on the entries; the least recently used
// entry is deleted to make room.
//
// Revoked scopes are appended to DIR/revoked (hex fingerprints, one per
// line): their entries are deleted now, and again at every start, so a crash
// between the revoke and the deletion cannot bring them back.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <set>
#include <string>
#include <unordered_map>

#include "tiers/blob_store.h"

namespace kvs::tiers {

class DiskStore final : public BlobStore {
 public:
  using Log = std::function<void(const std::string&)>;
  // Written into DIR: says what the folder is to whoever opens it.
  static constexpr const char* kMarker = "KVSERVE-TIER";
  // Creates DIR (mode 0700) if needed, then indexes what is there. Throws
  // std::runtime_error when DIR cannot be created or read, or holds anything
  // this store did not write (nothing in such a folder is touched).
  // One process per folder: the marker is held locked (flock) while the
  // store lives, and a second store on the folder is refused.
  DiskStore(std::string dir, int64_t capacity_bytes, int64_t now_unix, Log log = {});
  ~DiskStore() override;
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  const char* name() const override { return "disk"; }
  PutStatus put(const std::string& id, std::span<const uint8_t> blob, const BlobMeta& meta) override;
  GetStatus get(const std::string& id, std::vector<uint8_t>& out) override;
  // Records which master key seals the entries (`key_id`: a fingerprint of
  // it, never the key); entries written under another are unreadable, so a
  // changed key is said at start instead of showing only as misses.
  void note_key(const std::string& key_id);
  // Retention is a promise about the longest a prompt's K/V is kept: a
  // shorter one than the entries were written under applies to them too
  // (their expiry becomes at most written + `max_s`; the expired go now).
  // Returns how many entries were deleted.
  int64_t cap_retention(double max_s, int64_t now_unix);
  void touch(const std::string& id) override;
  void erase(const std::string& id) override;
  int64_t erase_scope(const ScopeFp& scope) override;
  int64_t sweep_expired(int64_t now_unix) override;
  int64_t bytes() const override { return bytes_.load(std::memory_order_relaxed); }
  int64_t evictions() const override { return evictions_.load(std::memory_order_relaxed); }

  int64_t entries() const { return int64_t(index_.size()); }
  int64_t capacity() const { return capacity_; }
  std::string path_of(const std::string& id) const;

 private:
  struct Entry {
    int64_t bytes = 0;
    ScopeFp scope{};
    int64_t expires = 0;
    std::list<std::string>::iterator lru;
    int64_t created = 0;  // wall-clock second it was written
  };
  void scan(int64_t now_unix);
  void load_revoked();
  void remove(const std::string& id);
  void log(const std::string& msg) const {
    if (log_) log_(msg);
  }

  std::string dir_;
  int lock_fd_ = -1;  // the marker, flock'ed
  void lock_folder();
  PutStatus write_failed(const std::string& path, int err);
  bool write_failing_ = false;  // an outage was logged; quiet until a write succeeds
  int64_t capacity_;
  Log log_;
  std::unordered_map<std::string, Entry> index_;
  std::list<std::string> lru_;  // front: least recently used
  std::set<ScopeFp> revoked_;
  std::set<ScopeFp> said_revoked_;  // scopes whose refused writes were logged (once each)
  std::atomic<int64_t> bytes_{0}, evictions_{0};
};

}  // namespace kvs::tiers
