// src/crypto: AEAD round trip and every way a sealed message can be wrong,
// key files (creation mode, refusal of loose permissions, damaged files), KDF.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "crypto/aead.h"
#include "crypto/kdf.h"
#include "crypto/secret_key.h"

namespace fs = std::filesystem;
using namespace kvs::crypto;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("kvs-crypto-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

TEST(Aead, RoundTrip) {
  const SecretKey k = SecretKey::random();
  const auto msg = bytes("the K and V of one block"), ad = bytes("key|model");
  std::vector<uint8_t> sealed;
  seal(k, msg, ad, sealed);
  ASSERT_EQ(sealed.size(), msg.size() + kSealOverhead);
  std::vector<uint8_t> out(msg.size());
  ASSERT_TRUE(open(k, sealed, ad, out));
  EXPECT_EQ(out, msg);
  // A second seal of the same message differs (fresh nonce).
  std::vector<uint8_t> again;
  seal(k, msg, ad, again);
  EXPECT_NE(again, sealed);
}

TEST(Aead, EveryChangeIsRejected) {
  const SecretKey k = SecretKey::random();
  const auto msg = bytes("0123456789abcdef0123456789abcdef"), ad = bytes("ad");
  std::vector<uint8_t> sealed;
  seal(k, msg, ad, sealed);
  std::vector<uint8_t> out(msg.size());
  for (size_t i = 0; i < sealed.size(); ++i) {  // one flipped bit anywhere: nonce, body or tag
    auto bad = sealed;
    bad[i] ^= 0x10;
    EXPECT_FALSE(open(k, bad, ad, out)) << "byte " << i;
    EXPECT_EQ(out, std::vector<uint8_t>(msg.size(), 0));
  }
  EXPECT_FALSE(open(k, sealed, bytes("other ad"), out));
  EXPECT_FALSE(open(SecretKey::random(), sealed, ad, out));
  std::vector<uint8_t> short_out(msg.size() - 1);
  EXPECT_FALSE(open(k, std::span(sealed).first(sealed.size() - 1), ad, short_out));  // truncated
  std::vector<uint8_t> none;
  EXPECT_FALSE(open(k, std::span(sealed).first(kSealOverhead - 1), ad, none));
}

TEST(KeyFile, CreatedOwnerOnlyAndReloaded) {
  const fs::path p = temp_dir() / "master.key";
  fs::remove(p);
  bool created = false;
  const SecretKey a = load_or_create_key_file(p.string(), &created);
  EXPECT_TRUE(created);
  struct stat st{};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const SecretKey b = load_or_create_key_file(p.string(), &created);
  EXPECT_FALSE(created);
  EXPECT_TRUE(std::equal(a.span().begin(), a.span().end(), b.span().begin()));
  fs::remove(p);
}

TEST(KeyFile, LoosePermissionsRefusedWithTheFix) {
  const fs::path p = temp_dir() / "loose.key";
  fs::remove(p);
  load_or_create_key_file(p.string());
  ASSERT_EQ(::chmod(p.c_str(), 0644), 0);
  try {
    load_or_create_key_file(p.string());
    FAIL() << "a group/world-readable key file was accepted";
  } catch (const KeyFileError& e) {
    EXPECT_NE(std::string(e.what()).find("0644"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
  }
  fs::remove(p);
}

TEST(KeyFile, DamagedFileRefused) {
  const fs::path p = temp_dir() / "damaged.key";
  fs::remove(p);
  std::ofstream(p) << "not a key\n";
  ::chmod(p.c_str(), 0600);
  EXPECT_THROW(load_key_file(p.string()), KeyFileError);
  fs::remove(p);
  EXPECT_THROW(load_key_file(p.string()), KeyFileError);  // missing
}

// A link is not followed, and the error says it is one (audit 9 M5: the
// message was "Too many levels of symbolic links").
TEST(KeyFile, ASymlinkIsRefusedAsOne) {
  const fs::path p = temp_dir() / "real.key", l = temp_dir() / "link.key";
  fs::remove(p);
  fs::remove(l);
  load_or_create_key_file(p.string());
  fs::create_symlink(p, l);
  try {
    load_or_create_key_file(l.string());
    FAIL() << "a symbolic link was followed";
  } catch (const KeyFileError& e) {
    EXPECT_NE(std::string(e.what()).find("is a symbolic link to " + p.string()), std::string::npos) << e.what();
  }
  fs::remove(l);
  fs::remove(p);
}

// Audit 9 L5: another user's file names chown first (chmod alone cannot
// fix it). Audit 9 L10: a missing folder is named, with the mkdir to run.
TEST(KeyFile, OtherOwnerAndMissingFolderSayWhatFixesThem) {
  const fs::path p = temp_dir() / "other-owner.key";
  fs::remove(p);
  load_or_create_key_file(p.string());
  if (::geteuid() == 0) {  // only root can give a file away
    ASSERT_EQ(::chown(p.c_str(), 65534, 65534), 0);
    try {
      load_key_file(p.string());
      FAIL() << "another user's key file was accepted";
    } catch (const KeyFileError& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("owned by uid 65534"), std::string::npos) << w;
      EXPECT_LT(w.find("chown 0 " + p.string()), w.find("chmod 600")) << w;
    }
  }
  fs::remove(p);
  const std::string missing = (temp_dir() / "no-such-folder" / "sub").string();
  try {
    load_or_create_key_file(missing + "/k.key");
    FAIL() << "created a key in a missing folder";
  } catch (const KeyFileError& e) {
    EXPECT_NE(std::string(e.what()).find("the folder " + missing + " does not exist; create it (`mkdir -p " + missing),
              std::string::npos)
        << e.what();
  }
}

TEST(Kdf, DeterministicAndSeparated) {
  const SecretKey m = SecretKey::random();
  const auto c1 = bytes("scope-1"), c2 = bytes("scope-2");
  auto same = [](const SecretKey& x, const SecretKey& y) {
    return std::equal(x.span().begin(), x.span().end(), y.span().begin());
  };
  EXPECT_TRUE(same(derive_key(m, "tier", c1), derive_key(m, "tier", c1)));
  EXPECT_FALSE(same(derive_key(m, "tier", c1), derive_key(m, "tier", c2)));
  EXPECT_FALSE(same(derive_key(m, "tier", c1), derive_key(m, "session", c1)));
  EXPECT_FALSE(same(derive_key(m, "tier", c1), derive_key(SecretKey::random(), "tier", c1)));
  // A subkey opens only what it sealed.
  std::vector<uint8_t> sealed, out(3);
  seal(derive_key(m, "tier", c1), bytes("abc"), {}, sealed);
  EXPECT_FALSE(open(derive_key(m, "tier", c2), sealed, {}, out));
  EXPECT_TRUE(open(derive_key(m, "tier", c1), sealed, {}, out));
}

TEST(Fingerprint, LengthAndLabel) {
  const auto d = bytes("data");
  std::array<uint8_t, 16> a{}, b{}, c{};
  fingerprint(d, a, "x");
  fingerprint(d, b, "x");
  fingerprint(d, c, "y");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

}  // namespace
