#include "tiers/sealed_block.h"

#include <cstring>
#include <stdexcept>

#include "crypto/aead.h"
#include "crypto/kdf.h"

namespace kvs::tiers {

static constexpr char kMagic[8] = {'K', 'V', 'S', 'T', 'I', 'E', 'R', '1'};
static constexpr uint32_t kVersion = 1;

static void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}
static void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}

static std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TierIdentity make_tier_identity(const std::string& model_identity, const std::string& layout_desc, size_t block_bytes) {
  TierIdentity t;
  crypto::fingerprint(bytes_of(model_identity), t.model, "kvserve-tier-model");
  crypto::fingerprint(bytes_of(layout_desc), t.layout, "kvserve-tier-layout");
  t.block_bytes = block_bytes;
  return t;
}

std::string entry_id(const BlockKey& key, const TierIdentity& id) {
  std::vector<uint8_t> in(key.begin(), key.end());
  in.insert(in.end(), id.model.begin(), id.model.end());
  in.insert(in.end(), id.layout.begin(), id.layout.end());
  std::array<uint8_t, 16> fp{};
  crypto::fingerprint(in, fp, "kvserve-tier-entry");
  return hex(fp);
}

std::string hex(std::span<const uint8_t> bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes.size());
  for (uint8_t b : bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

ScopeFp scope_fingerprint(const Scope& scope) {
  ScopeFp fp{};
  crypto::fingerprint(scope.bytes, fp, "kvserve-tier-scope");
  return fp;
}

static void write_header(const EntryHeader& h, uint8_t* p) {
  std::memset(p, 0, kHeaderBytes);
  std::memcpy(p, kMagic, 8);
  put_u32(p + 8, kVersion);
  put_u32(p + 12, uint32_t(kHeaderBytes));
  std::memcpy(p + 16, h.model.data(), 16);
  std::memcpy(p + 32, h.layout.data(), 16);
  std::memcpy(p + 48, h.scope.data(), 16);
  put_u64(p + 64, uint64_t(h.created_unix));
  put_u64(p + 72, uint64_t(h.expires_unix));
  put_u64(p + 80, h.payload_bytes);
}

bool parse_header(std::span<const uint8_t> blob, EntryHeader& h) {
  if (blob.size() < kHeaderBytes || std::memcmp(blob.data(), kMagic, 8) != 0) return false;
  const uint8_t* p = blob.data();
  if (get_u32(p + 8) != kVersion || get_u32(p + 12) != kHeaderBytes) return false;
  std::memcpy(h.model.data(), p + 16, 16);
  std::memcpy(h.layout.data(), p + 32, 16);
  std::memcpy(h.scope.data(), p + 48, 16);
  h.created_unix = int64_t(get_u64(p + 64));
  h.expires_unix = int64_t(get_u64(p + 72));
  h.payload_bytes = get_u64(p + 80);
  return true;
}

static std::vector<uint8_t> associated_data(std::span<const uint8_t> header, const BlockKey& key) {
  std::vector<uint8_t> ad(header.begin(), header.end());
  ad.insert(ad.end(), key.begin(), key.end());
  return ad;
}

std::vector<uint8_t> seal_block(const crypto::SecretKey& scope_key, const BlockKey& key, const TierIdentity& id,
                                const EntryHeader& h, std::span<const uint8_t> block) {
  if (block.size() != id.block_bytes) throw std::invalid_argument("seal_block: block has the wrong size");
  EntryHeader hh = h;
  hh.model = id.model;
  hh.layout = id.layout;
  hh.payload_bytes = block.size();
  std::vector<uint8_t> out(kHeaderBytes);
  write_header(hh, out.data());
  const std::vector<uint8_t> ad = associated_data({out.data(), kHeaderBytes}, key);
  crypto::seal(scope_key, block, ad, out);
  return out;
}

const char* to_string(OpenStatus s) {
  switch (s) {
    case OpenStatus::Ok: return "ok";
    case OpenStatus::Corrupt: return "corrupt";
    case OpenStatus::OtherModel: return "other_model";
    case OpenStatus::Expired: return "expired";
    case OpenStatus::Forged: return "failed_authentication";
  }
  return "?";
}

OpenStatus open_block(const crypto::SecretKey& scope_key, const BlockKey& key, const TierIdentity& id,
                      std::span<const uint8_t> blob, int64_t now_unix, std::span<uint8_t> out) {
  EntryHeader h;
  if (!parse_header(blob, h)) return OpenStatus::Corrupt;
  if (h.model != id.model || h.layout != id.layout) return OpenStatus::OtherModel;
  if (h.payload_bytes != id.block_bytes || out.size() != id.block_bytes ||
      blob.size() != kHeaderBytes + h.payload_bytes + crypto::kSealOverhead)
    return OpenStatus::Corrupt;
  if (h.expires_unix <= now_unix) return OpenStatus::Expired;
  const std::vector<uint8_t> ad = associated_data(blob.first(kHeaderBytes), key);
  if (!crypto::open(scope_key, blob.subspan(kHeaderBytes), ad, out)) return OpenStatus::Forged;
  return OpenStatus::Ok;
}

}  // namespace kvs::tiers
