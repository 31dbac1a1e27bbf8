// KV tiers below the RAM pool: the sealed entry format (every way an entry
// can be wrong is a miss), the disk store (capacity LRU with exact entries,
// restart, revoked scopes, stray files, a capacity below one block), the tier
// set (write-behind, staged fetch, a corrupted file deleted and counted, a
// revoke deleting files), and KvManager importing staged blocks into exact
// block ids.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <chrono>
#include <map>
#include <thread>

#include "crypto/kdf.h"
#include "kv/kv_manager.h"
#include "tiers/disk_store.h"
#include "tiers/sealed_block.h"
#include "tiers/tier_set.h"

namespace fs = std::filesystem;
using namespace kvs;
using namespace kvs::tiers;

namespace {

constexpr int64_t kNow = 1'800'000'000;

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kvs-tier-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  return d.string();
}

BlockKey key_of(int i) {
  BlockKey k{};
  k[0] = uint8_t(i);
  k[1] = uint8_t(i >> 8);
  k[31] = 0x5a;
  return k;
}

Scope scope_of(const std::string& s) { return make_scope("model-a", s); }

std::vector<uint8_t> block_bytes(size_t n, int seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed * 31 + i * 7);
  return b;
}

TierIdentity ident(const std::string& model = "model-a", size_t bytes = 256) {
  return make_tier_identity(model, "f32 block 4", bytes);
}

crypto::SecretKey scope_key(const crypto::SecretKey& master, const Scope& s) {
  return crypto::derive_key(master, "kv-tier-block", s.bytes);
}

TEST(SealedBlock, OpensOnlyWhatWasSealed) {
  const crypto::SecretKey master = crypto::SecretKey::random();
  const TierIdentity id = ident();
  const Scope sc = scope_of("tenant-a");
  const auto plain = block_bytes(id.block_bytes, 1);
  EntryHeader h;
  h.scope = scope_fingerprint(sc);
  h.created_unix = kNow;
  h.expires_unix = kNow + 60;
  const auto blob = seal_block(scope_key(master, sc), key_of(1), id, h, plain);
  std::vector<uint8_t> out(id.block_bytes);
  ASSERT_EQ(open_block(scope_key(master, sc), key_of(1), id, blob, kNow, out), OpenStatus::Ok);
  EXPECT_EQ(out, plain);
  // No plaintext byte run of the block appears in the entry.
  EXPECT_EQ(std::search(blob.begin(), blob.end(), plain.begin(), plain.begin() + 16), blob.end());

  EXPECT_EQ(open_block(scope_key(master, scope_of("tenant-b")), key_of(1), id, blob, kNow, out), OpenStatus::Forged);
  EXPECT_EQ(open_block(scope_key(master, sc), key_of(2), id, blob, kNow, out), OpenStatus::Forged);  // renamed
  EXPECT_EQ(open_block(scope_key(master, sc), key_of(1), ident("model-b"), blob, kNow, out), OpenStatus::OtherModel);
  EXPECT_EQ(open_block(scope_key(master, sc), key_of(1), id, blob, kNow + 60, out), OpenStatus::Expired);
  auto tampered = blob;
  tampered[kHeaderBytes + 40] ^= 1;
  EXPECT_EQ(open_block(scope_key(master, sc), key_of(1), id, tampered, kNow, out), OpenStatus::Forged);
  auto later = blob;  // an edited expiry is part of the authenticated header
  later[72] ^= 0x40;
  EXPECT_EQ(open_block(scope_key(master, sc), key_of(1), id, later, kNow, out), OpenStatus::Forged);
  EXPECT_EQ(open_block(scope_key(master, sc), key_of(1), id, std::span(blob).first(blob.size() - 1), kNow, out),
            OpenStatus::Corrupt);
  EXPECT_EQ(open_block(scope_key(master, sc), key_of(1), id, std::span(blob).first(10), kNow, out), OpenStatus::Corrupt);
  EXPECT_EQ(out, std::vector<uint8_t>(id.block_bytes, 0));  // a failed open leaves nothing behind
}

BlobMeta meta(const std::string& scope, int64_t expires = kNow + 3600) { return {scope_fingerprint(scope_of(scope)), expires}; }

TEST(DiskStore, CapacityEvictsLeastRecentlyUsed) {
  const std::string dir = fresh_dir("lru");
  DiskStore d(dir, 300, kNow);
  const auto b = block_bytes(100, 0);
  EXPECT_EQ(d.put("aaaa01", b, meta("t")), PutStatus::Stored);
  EXPECT_EQ(d.put("aaaa02", b, meta("t")), PutStatus::Stored);
  EXPECT_EQ(d.put("aaaa03", b, meta("t")), PutStatus::Stored);
  std::vector<uint8_t> got;
  EXPECT_EQ(d.get("aaaa01", got), GetStatus::Hit);  // 01 is now the most recent
  EXPECT_EQ(d.put("aaaa02", b, meta("t")), PutStatus::Exists);  // refreshes 02 without a write
  EXPECT_EQ(d.put("aaaa04", b, meta("t")), PutStatus::Stored);  // evicts 03, the least recent
  EXPECT_EQ(d.get("aaaa03", got), GetStatus::Miss);
  EXPECT_FALSE(fs::exists(d.path_of("aaaa03")));
  EXPECT_EQ(d.get("aaaa01", got), GetStatus::Hit);
  EXPECT_EQ(d.evictions(), 1);
  EXPECT_EQ(d.bytes(), 300);
  EXPECT_EQ(d.put("aaaa05", block_bytes(301, 0), meta("t")), PutStatus::NoRoom);  // larger than the whole tier
  fs::remove_all(dir);
}

// A chain's blocks are kept head first (audit 9 H1): a block goes just
// before its parent in the LRU order, a full store skips a block that would
// be the first out, and a read chain is touched tail first.
TEST(DiskStore, AFullStoreKeepsChainHeadsNotTails) {
  const std::string dir = fresh_dir("chain");
  DiskStore d(dir, 400, kNow);  // four entries
  const auto b = block_bytes(100, 0);
  auto link = [&](const std::string& parent) {
    BlobMeta m = meta("t");
    m.parent = parent;
    return m;
  };
  EXPECT_EQ(d.put("c0c000", b, link("")), PutStatus::Stored);
  for (const auto& [id, parent] : std::vector<std::pair<std::string, std::string>>{
           {"c0c001", "c0c000"}, {"c0c002", "c0c001"}, {"c0c003", "c0c002"}})
    EXPECT_EQ(d.put(id, b, link(parent)), PutStatus::Stored) << id;
  // Full: the chain's next blocks would be the first out.
  EXPECT_EQ(d.put("c0c004", b, link("c0c003")), PutStatus::Skipped);
  EXPECT_EQ(d.put("c0c005", b, link("c0c004")), PutStatus::Skipped);
  EXPECT_FALSE(fs::exists(d.path_of("c0c004")));
  // Another chain evicts the first one's tail, deepest first.
  EXPECT_EQ(d.put("d0d000", b, link("")), PutStatus::Stored);        // out: c0c003
  EXPECT_EQ(d.put("d0d001", b, link("d0d000")), PutStatus::Stored);  // out: c0c002
  std::vector<uint8_t> got;
  for (const char* kept : {"c0c000", "c0c001", "d0d000", "d0d001"}) EXPECT_TRUE(fs::exists(d.path_of(kept))) << kept;
  for (const char* gone : {"c0c002", "c0c003"}) EXPECT_FALSE(fs::exists(d.path_of(gone))) << gone;
  // Read head first, touched tail first (as the tier set does): the c chain
  // is now the most recent, and d's tail is the next out.
  EXPECT_EQ(d.get("c0c000", got), GetStatus::Hit);
  EXPECT_EQ(d.get("c0c001", got), GetStatus::Hit);
  d.touch("c0c001");
  d.touch("c0c000");
  EXPECT_EQ(d.put("e0e000", b, link("")), PutStatus::Stored);  // out: d0d001
  EXPECT_FALSE(fs::exists(d.path_of("d0d001")));
  EXPECT_TRUE(fs::exists(d.path_of("d0d000")));
  EXPECT_EQ(d.evictions(), 3);
  fs::remove_all(dir);
}

// Audit 9 H7: a shorter retention than the entries were written under
// applies to them: written + the new retention, the expired deleted now.
TEST(DiskStore, AShorterRetentionCapsEntriesAlreadyWritten) {
  const std::string dir = fresh_dir("retention");
  const int64_t now = int64_t(std::time(nullptr));
  {
    const crypto::SecretKey master = crypto::SecretKey::random();
    EntryHeader h;
    h.scope = scope_fingerprint(scope_of("t"));
    h.created_unix = now;
    h.expires_unix = now + 86400;  // written under a day's retention
    const TierIdentity id = ident();
    DiskStore d(dir, 1 << 20, now);
    EXPECT_EQ(d.put("efef01", seal_block(scope_key(master, scope_of("t")), key_of(1), id, h, block_bytes(id.block_bytes, 1)),
                    meta("t", now + 86400)),
              PutStatus::Stored);
  }
  std::vector<std::string> said;
  DiskStore d(dir, 1 << 20, now, [&](const std::string& s) { said.push_back(s); });
  std::vector<uint8_t> got;
  EXPECT_EQ(d.cap_retention(3600, now), 0) << "written just now: an hour still holds it";
  EXPECT_EQ(d.get("efef01", got), GetStatus::Hit);
  EXPECT_EQ(d.cap_retention(3600, now + 7200), 1) << "two hours later it is past the new retention";
  EXPECT_EQ(d.get("efef01", got), GetStatus::Miss);
  EXPECT_FALSE(fs::exists(d.path_of("efef01")));
  ASSERT_FALSE(said.empty());
  EXPECT_NE(said.back().find("longer retention deleted"), std::string::npos) << said.back();
  fs::remove_all(dir);
}

// Audit 9 M2: entries under another master key are said at start.
TEST(DiskStore, AnotherMasterKeyIsSaid) {
  const std::string dir = fresh_dir("keyid");
  {
    const crypto::SecretKey master = crypto::SecretKey::random();
    EntryHeader h;
    h.scope = scope_fingerprint(scope_of("t"));
    h.created_unix = kNow;
    h.expires_unix = kNow + 100;
    const TierIdentity id = ident();
    DiskStore d(dir, 1 << 20, kNow);
    d.note_key("aaaa");
    EXPECT_EQ(d.put("abab01", seal_block(scope_key(master, scope_of("t")), key_of(1), id, h, block_bytes(id.block_bytes, 1)),
                    meta("t", kNow + 100)),
              PutStatus::Stored);
  }
  std::vector<std::string> said;
  {
    DiskStore d(dir, 1 << 20, kNow, [&](const std::string& s) { said.push_back(s); });
    d.note_key("aaaa");
  }
  for (const auto& s : said) EXPECT_EQ(s.find("another master key"), std::string::npos) << s;
  DiskStore d(dir, 1 << 20, kNow, [&](const std::string& s) { said.push_back(s); });
  d.note_key("bbbb");
  ASSERT_FALSE(said.empty());
  EXPECT_NE(said.back().find("1 entries in " + dir + " were written under another master key"), std::string::npos)
      << said.back();
  fs::remove_all(dir);
}

TEST(DiskStore, RestartKeepsEntriesDropsExpiredRevokedAndStrays) {
  const std::string dir = fresh_dir("restart");
  const crypto::SecretKey master = crypto::SecretKey::random();
  const TierIdentity id = ident();
  auto entry = [&](const std::string& scope, int64_t expires) {
    EntryHeader h;
    h.scope = scope_fingerprint(scope_of(scope));
    h.created_unix = kNow;
    h.expires_unix = expires;
    return seal_block(scope_key(master, scope_of(scope)), key_of(1), id, h, block_bytes(id.block_bytes, 2));
  };
  {
    DiskStore d(dir, 1 << 20, kNow);
    d.put("bbbb01", entry("keep", kNow + 100), meta("keep", kNow + 100));
    d.put("bbbb02", entry("keep", kNow + 5), meta("keep", kNow + 5));
    d.put("bbbb03", entry("gone", kNow + 100), meta("gone", kNow + 100));
    EXPECT_EQ(d.erase_scope(scope_fingerprint(scope_of("gone"))), 1);
    EXPECT_FALSE(fs::exists(d.path_of("bbbb03")));
    d.put("bbbb04", entry("gone", kNow + 100), meta("gone", kNow + 100));  // refused: revoked
    EXPECT_FALSE(fs::exists(d.path_of("bbbb04")));
  }
  std::ofstream(dir + "/bb/bbbb05.kvb.tmp") << "half a write";
  std::ofstream(dir + "/bb/bbbb06.kvb") << "not an entry";
  std::vector<std::string> said;
  DiskStore d(dir, 1 << 20, kNow + 10, [&](const std::string& s) { said.push_back(s); });  // bbbb02 expired meanwhile
  EXPECT_EQ(d.entries(), 1);
  // The revoke outlived the restart: a write for it fails, said once.
  const size_t before = said.size();
  EXPECT_EQ(d.put("bbbb07", entry("gone", kNow + 100), meta("gone", kNow + 100)), PutStatus::Failed);
  EXPECT_EQ(d.put("bbbb08", entry("gone", kNow + 100), meta("gone", kNow + 100)), PutStatus::Failed);
  ASSERT_EQ(said.size(), before + 1);
  EXPECT_NE(said.back().find("permission_version"), std::string::npos) << said.back();
  std::vector<uint8_t> got;
  EXPECT_EQ(d.get("bbbb01", got), GetStatus::Hit);
  EXPECT_EQ(d.get("bbbb02", got), GetStatus::Miss);
  EXPECT_FALSE(fs::exists(dir + "/bb/bbbb05.kvb.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/bb/bbbb06.kvb"));
  EXPECT_EQ(d.sweep_expired(kNow + 200), 1);
  EXPECT_EQ(d.entries(), 0);
  fs::remove_all(dir);
}

// Audit 9 L8: a damaged revoked list is said at start, a folder in its
// place refuses the start (a revoke could not be kept).
TEST(DiskStore, ADamagedRevokedListIsSaidAndAFolderThereRefused) {
  const std::string dir = fresh_dir("revoked-list");
  { DiskStore d(dir, 1 << 20, kNow); }
  const ScopeFp gone = scope_fingerprint(scope_of("gone"));
  std::ofstream(dir + "/revoked") << hex(gone) << "\n\x01garbage\xfe\nzz\n";
  std::vector<std::string> said;
  {
    DiskStore d(dir, 1 << 20, kNow, [&](const std::string& s) { said.push_back(s); });
    EXPECT_EQ(d.put("cccc01", std::vector<uint8_t>(8, 1), meta("gone")), PutStatus::Failed);  // still revoked
  }
  bool told = false;
  for (auto& l : said) told |= l.find("2 lines are not revoked-scope fingerprints") != std::string::npos;
  EXPECT_TRUE(told);
  fs::remove(dir + "/revoked");
  fs::create_directory(dir + "/revoked");
  try {
    DiskStore d(dir, 1 << 20, kNow);
    ADD_FAILURE() << "a folder named revoked was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/revoked is not a file"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// A folder with anything kvserve did not write is refused whole and left
// exactly as it was (a home folder given by mistake, a checkout); a folder
// the store wrote opens again.
TEST(DiskStore, AFolderWithOthersFilesIsRefusedAndUntouched) {
  for (const std::string& foreign : {"Documents/thesis.odt", "ab/notes.txt", "ab/cd.kvb.bak", ".bashrc", "ab/x.kvb"}) {
    const std::string dir = fresh_dir("foreign");
    fs::create_directories(fs::path(dir + "/" + foreign).parent_path());
    std::ofstream(dir + "/" + foreign) << "precious";
    const auto mode = fs::status(dir).permissions();
    try {
      DiskStore d(dir, 1 << 20, kNow);
      ADD_FAILURE() << foreign << ": opened a folder holding another's file";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("not a kvserve tier folder"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(foreign.substr(0, foreign.find('/'))), std::string::npos) << e.what();
    }
    std::ifstream in(dir + "/" + foreign);
    std::string got;
    std::getline(in, got);
    EXPECT_EQ(got, "precious") << foreign;
    EXPECT_FALSE(fs::exists(dir + "/" + DiskStore::kMarker)) << "nothing written into it";
    EXPECT_EQ(fs::status(dir).permissions(), mode) << "its mode is left alone";
    fs::remove_all(dir);
  }
  const std::string dir = fresh_dir("own");
  {
    DiskStore d(dir, 1 << 20, kNow);
    // One server per folder (audit 9 M1): a second store is refused while
    // the first lives.
    try {
      DiskStore twice(dir, 1 << 20, kNow);
      ADD_FAILURE() << "a second store opened a folder in use";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("in use by another kvserve"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(fs::exists(dir + "/" + DiskStore::kMarker));
  EXPECT_NO_THROW(DiskStore(dir, 1 << 20, kNow));
  fs::remove_all(dir);
}

// A real full disk: a tmpfs smaller than one entry (needs root; skipped
// otherwise). The write fails with ENOSPC, the half-written temporary is
// removed, nothing is indexed, and one line says why.
TEST(DiskStore, FullFilesystemFailsTheWriteCleanly) {
  const std::string dir = fresh_dir("tmpfs");
  fs::create_directories(dir);
  const std::string cmd = "mount -t tmpfs -o size=64k tmpfs " + dir + " 2>/dev/null";
  if (::geteuid() != 0 || std::system(cmd.c_str()) != 0) {
    fs::remove_all(dir);
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  }
  {
    std::vector<std::string> log;
    DiskStore d(dir, int64_t(1) << 30, kNow, [&](const std::string& s) { log.push_back(s); });
    EXPECT_EQ(d.put("cccc01", block_bytes(16 << 10, 1), meta("t")), PutStatus::Stored);
    EXPECT_EQ(d.put("cccc02", block_bytes(256 << 10, 2), meta("t")), PutStatus::Failed);
    EXPECT_FALSE(fs::exists(d.path_of("cccc02")));
    EXPECT_FALSE(fs::exists(d.path_of("cccc02") + ".tmp"));
    EXPECT_EQ(d.entries(), 1);
    EXPECT_EQ(d.bytes(), 16 << 10);
    ASSERT_EQ(log.size(), 1u);
    EXPECT_NE(log[0].find("No space left"), std::string::npos) << log[0];
    EXPECT_EQ(d.put("cccc03", block_bytes(256 << 10, 3), meta("t")), PutStatus::Failed);
    EXPECT_EQ(log.size(), 1u) << "one line per outage, not per block";
    std::vector<uint8_t> got;
    EXPECT_EQ(d.get("cccc01", got), GetStatus::Hit);
  }
  std::system(("umount " + dir).c_str());
  fs::remove_all(dir);
}

std::unique_ptr<TierSet> disk_tier(const std::string& dir, const crypto::SecretKey& master, const TierIdentity& id,
                                   int64_t cap = 1 << 20, std::vector<std::string>* log = nullptr) {
  std::vector<std::unique_ptr<BlobStore>> st;
  st.push_back(std::make_unique<DiskStore>(dir, cap, int64_t(std::time(nullptr))));
  return std::make_unique<TierSet>(master, id, std::move(st), TierSetOptions{},
                                   [log](const std::string& s) { if (log) log->push_back(s); });
}

void wait_fetch(TierSet& t, uint64_t ticket) {
  for (int i = 0; i < 500 && t.pending(ticket); ++i) usleep(2000);
  ASSERT_FALSE(t.pending(ticket));
}

TEST(TierSet, WriteBehindThenFetchStagesTheChainUntilTheFirstMiss) {
  const std::string dir = fresh_dir("set");
  const crypto::SecretKey master = crypto::SecretKey::random();
  const TierIdentity id = ident();
  auto t = disk_tier(dir, master, id);
  const Scope sc = scope_of("a");
  t->offer(key_of(1), sc, block_bytes(id.block_bytes, 1));
  t->offer(key_of(2), sc, block_bytes(id.block_bytes, 2));
  t->offer(key_of(4), sc, block_bytes(id.block_bytes, 4));
  t->flush();
  EXPECT_EQ(t->stats().tiers[0].stores, 3);
  const uint64_t ticket = t->prefetch({key_of(1), key_of(2), key_of(3), key_of(4)}, sc, 0);
  ASSERT_NE(ticket, 0u);
  wait_fetch(*t, ticket);
  EXPECT_GE(t->seconds(ticket), 0);
  EXPECT_TRUE(t->staged(key_of(1)));
  EXPECT_TRUE(t->staged(key_of(2)));
  EXPECT_FALSE(t->staged(key_of(4)));  // after the miss at 3: useless without 3
  std::vector<uint8_t> dst(id.block_bytes);
  ASSERT_TRUE(t->take(key_of(2), dst));
  EXPECT_EQ(dst, block_bytes(id.block_bytes, 2));
  EXPECT_FALSE(t->staged(key_of(2)));  // taken once
  const TierSetStats s = t->stats();
  EXPECT_EQ(s.tiers[0].hits, 2);
  EXPECT_EQ(s.tiers[0].misses, 1);
  // Another scope's fetch of the same keys opens nothing (another key).
  const uint64_t other = t->prefetch({key_of(4)}, scope_of("b"), 0);
  wait_fetch(*t, other);
  EXPECT_FALSE(t->staged(key_of(4)));
  fs::remove_all(dir);
}

// A tenant's retention (from --api-keys, passed with its requests) bounds
// how long its entries are served: past it they are misses and get deleted.
TEST(TierSet, TenantRetentionExpiresItsEntries) {
  const std::string dir = fresh_dir("retention");
  const crypto::SecretKey master = crypto::SecretKey::random();
  const TierIdentity id = ident();
  auto t = disk_tier(dir, master, id);
  const Scope brief = scope_of("brief"), lasting = scope_of("lasting");
  EXPECT_EQ(t->prefetch({}, brief, 1.0), 0u);  // a request of the tenant names its retention
  t->offer(key_of(1), brief, block_bytes(id.block_bytes, 1));
  t->offer(key_of(2), lasting, block_bytes(id.block_bytes, 2));  // default retention (a day)
  t->flush();
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const uint64_t a = t->prefetch({key_of(1)}, brief, 1.0), b = t->prefetch({key_of(2)}, lasting, 0);
  wait_fetch(*t, a);
  wait_fetch(*t, b);
  EXPECT_FALSE(t->staged(key_of(1)));
  EXPECT_TRUE(t->staged(key_of(2)));
  const std::string expired = dir + "/" + entry_id(key_of(1), id).substr(0, 2) + "/" + entry_id(key_of(1), id) + ".kvb";
  EXPECT_FALSE(fs::exists(expired));
  EXPECT_EQ(t->stats().tiers[0].errors, 0);  // expiry is a miss, not an error
  fs::remove_all(dir);
}

TEST(TierSet, CorruptedFileIsAMissCountedAndDeleted) {
  const std::string dir = fresh_dir("corrupt");
  const crypto::SecretKey master = crypto::SecretKey::random();
  const TierIdentity id = ident();
  std::vector<std::string> log;
  auto t = disk_tier(dir, master, id, 1 << 20, &log);
  const Scope sc = scope_of("a");
  t->offer(key_of(1), sc, block_bytes(id.block_bytes, 1));
  t->flush();
  const std::string path = dir + "/" + entry_id(key_of(1), id).substr(0, 2) + "/" + entry_id(key_of(1), id) + ".kvb";
  ASSERT_TRUE(fs::exists(path));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kHeaderBytes + 30);
    f.put('\x7f');
  }
  const uint64_t ticket = t->prefetch({key_of(1)}, sc, 0);
  wait_fetch(*t, ticket);
  EXPECT_FALSE(t->staged(key_of(1)));
  EXPECT_EQ(t->stats().tiers[0].errors, 1);
  EXPECT_FALSE(fs::exists(path));
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.back().find("failed_authentication"), std::string::npos) << log.back();
  EXPECT_EQ(log.back().find(to_hex(key_of(1))), std::string::npos);  // hashed id, never the key
  fs::remove_all(dir);
}

// Every entry of a chain bit-flipped: one fetch deletes them all (it
// deleted the first only; the others stayed until a request reached each).
TEST(TierSet, ABadEntryDeletesTheRestOfItsChain) {
  const std::string dir = fresh_dir("corrupt-chain");
  const crypto::SecretKey master = crypto::SecretKey::random();
  const TierIdentity id = ident();
  auto t = disk_tier(dir, master, id);
  const Scope sc = scope_of("a");
  std::vector<BlockKey> chain;
  for (int i = 0; i < 4; ++i) {
    chain.push_back(key_of(i));
    t->offer(key_of(i), sc, block_bytes(id.block_bytes, i));
  }
  t->offer(key_of(9), sc, block_bytes(id.block_bytes, 9));  // another chain: stays
  t->flush();
  auto path = [&](int i) {
    const std::string e = entry_id(key_of(i), id);
    return dir + "/" + e.substr(0, 2) + "/" + e + ".kvb";
  };
  for (int i = 0; i < 4; ++i) {
    std::fstream f(path(i), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kHeaderBytes + 30);
    f.put('\x7f');
  }
  wait_fetch(*t, t->prefetch(chain, sc, 0));
  EXPECT_EQ(t->stats().tiers[0].errors, 1);  // one rejected: the rest never read
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(fs::exists(path(i))) << i;
  EXPECT_TRUE(fs::exists(path(9)));
  // The recomputed chain is stored again in full.
  for (int i = 0; i < 4; ++i) t->offer(key_of(i), sc, block_bytes(id.block_bytes, i));
  t->flush();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(fs::exists(path(i))) << i;
  fs::remove_all(dir);
}

TEST(TierSet, RevokeDeletesTheScopesFilesAndRefusesNewOnes) {
  const std::string dir = fresh_dir("revoke");
  const crypto::SecretKey master = crypto::SecretKey::random();
  const TierIdentity id = ident();
  auto t = disk_tier(dir, master, id);
  const Scope a = scope_of("a"), b = scope_of("b");
  for (int i = 0; i < 3; ++i) t->offer(key_of(i), a, block_bytes(id.block_bytes, i));
  t->offer(key_of(9), b, block_bytes(id.block_bytes, 9));
  t->flush();
  auto files = [&] {
    int n = 0;
    for (auto& e : fs::recursive_directory_iterator(dir)) n += e.path().extension() == ".kvb";
    return n;
  };
  EXPECT_EQ(files(), 4);
  t->drop_scope(a);
  t->flush();
  EXPECT_EQ(files(), 1);  // b's entry stays
  t->offer(key_of(5), a, block_bytes(id.block_bytes, 5));
  t->flush();
  EXPECT_EQ(files(), 1);
  EXPECT_EQ(t->prefetch({key_of(0)}, a, 0), 0u);
  fs::remove_all(dir);
}

TEST(TierSet, CapacityBelowOneBlockStoresNothingAndSaysSo) {
  const std::string dir = fresh_dir("tiny");
  const crypto::SecretKey master = crypto::SecretKey::random();
  const TierIdentity id = ident();
  std::vector<std::string> log;
  auto t = disk_tier(dir, master, id, 64, &log);
  t->offer(key_of(1), scope_of("a"), block_bytes(id.block_bytes, 1));
  t->offer(key_of(2), scope_of("a"), block_bytes(id.block_bytes, 2));
  t->flush();
  EXPECT_EQ(t->stats().tiers[0].stores, 0);
  EXPECT_EQ(t->stats().tiers[0].errors, 2);
  ASSERT_EQ(log.size(), 1u);  // one line, not one per block
  EXPECT_NE(log[0].find("larger than the tier's capacity"), std::string::npos);
  fs::remove_all(dir);
}

// A stand-in lower tier holding plain bytes in a map, to pin KvManager's
// import to exact block ids.
struct MapImporter final : BlockImporter {
  std::map<BlockKey, int> have;  // key -> fill value
  std::vector<std::pair<int32_t, int>> filled;
  bool ready(const BlockKey& k) override { return have.count(k) != 0; }
  bool fill(const BlockKey& k, int32_t b) override {
    filled.push_back({b, have.at(k)});
    return true;
  }
};

TEST(KvManagerImport, ContinuesTheChainPastRamIntoFreshBlocks) {
  KvManager kv(8, KvManagerOptions::basic(4, true));
  const Scope sc = scope_of("a");
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};  // 3 full blocks + 1
  // Block 0 of the chain is in RAM (computed by an earlier sequence).
  SeqAdmission first = kv.add_sequence(std::span(prompt).first(4), sc);
  ASSERT_TRUE(kv.reserve(first.seq, 4));
  kv.commit(first.seq, std::span(prompt).first(4));
  EXPECT_EQ(kv.block_table(first.seq), (std::vector<int32_t>{0}));
  kv.release(first.seq);  // block 0: cached
  const std::vector<BlockKey> keys = kv.chain_keys(prompt, sc);
  ASSERT_EQ(keys.size(), 3u);
  MapImporter imp;
  imp.have[keys[1]] = 11;
  imp.have[keys[2]] = 12;
  const SeqAdmission a = kv.add_sequence(prompt, sc, &imp);
  EXPECT_EQ(a.cached_tokens, 12);
  EXPECT_EQ(a.imported_tokens, 8);
  // RAM hit 0, then fresh blocks from the free stack: 1 and 2.
  EXPECT_EQ(kv.block_table(a.seq), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(imp.filled, (std::vector<std::pair<int32_t, int>>{{1, 11}, {2, 12}}));
  EXPECT_TRUE(kv.pool().has_key(1));
  EXPECT_EQ(kv.pool().key(2), keys[2]);
  EXPECT_EQ(kv.stats().imported_blocks, 2);
  kv.check_invariants(true);
  // Released: all three stay cached, so the next request hits them in RAM.
  kv.release(a.seq);
  MapImporter none;
  const SeqAdmission b = kv.add_sequence(prompt, sc, &none);
  EXPECT_EQ(b.cached_tokens, 12);
  EXPECT_EQ(b.imported_tokens, 0);
  EXPECT_TRUE(none.filled.empty());
  kv.check_invariants(true);
}

TEST(KvManagerImport, FullyImportedPromptGivesBackTheBlockItRecomputes) {
  KvManager kv(8, KvManagerOptions::basic(4, true));
  const Scope sc = scope_of("a");
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};  // exactly 2 blocks
  MapImporter imp;
  const auto keys = kv.chain_keys(prompt, sc);
  imp.have[keys[0]] = 1;
  imp.have[keys[1]] = 2;
  const SeqAdmission a = kv.add_sequence(prompt, sc, &imp);
  // The last token is recomputed for its logits: the sequence sees 7 tokens
  // and keeps both blocks (the second will be copied on write).
  EXPECT_EQ(a.cached_tokens, 7);
  EXPECT_EQ(a.imported_tokens, 7);
  EXPECT_EQ(kv.block_table(a.seq), (std::vector<int32_t>{0, 1}));
  kv.check_invariants(true);
}

TEST(KvManagerImport, NoImportWhenThePoolIsFull) {
  KvManager kv(2, KvManagerOptions::basic(4, true));
  const Scope sc = scope_of("a");
  const std::vector<int32_t> other = {9, 9, 9, 9, 9, 9, 9, 9};
  SeqAdmission o = kv.add_sequence(other, sc);
  ASSERT_TRUE(kv.reserve(o.seq, 8));  // both blocks used
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  MapImporter imp;
  imp.have[kv.chain_keys(prompt, sc)[0]] = 1;
  const SeqAdmission a = kv.add_sequence(prompt, sc, &imp);
  EXPECT_EQ(a.cached_tokens, 0);
  EXPECT_TRUE(imp.filled.empty());
  kv.check_invariants();
}

}  // namespace
