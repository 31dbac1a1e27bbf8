#include "server/tenants.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace kvs::server {

namespace {

const char* kAnonymous = "anonymous";

std::array<uint8_t, 32> sha256(const std::string& s) {
  std::array<uint8_t, 32> out{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), out.data());
  return out;
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = d[p[i] >> 4];
    s[2 * i + 1] = d[p[i] & 15];
  }
  return s;
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}
// Length-prefixed, so ("ab","c") and ("a","bc") give different HMAC input.
void append_field(std::string& s, const std::string& f) {
  append_u64(s, f.size());
  s += f;
}

}  // namespace

std::string sha256_hex(const std::string& s) {
  const auto h = sha256(s);
  return hex(h.data(), h.size());
}

std::string tenant_hash(const std::string& tenant) { return sha256_hex("kvserve-tenant:" + tenant).substr(0, 16); }

std::vector<uint8_t> random_secret(size_t n) {
  std::vector<uint8_t> b(n);
  if (RAND_bytes(b.data(), int(n)) != 1) throw std::runtime_error("cannot read random bytes for the cache secret");
  return b;
}

TenantRegistry::TenantRegistry() {
  TenantPolicy p;
  p.id = kAnonymous;
  tenants_[p.id].policy = p;
  secret_ = random_secret();
}

std::unique_ptr<TenantRegistry> TenantRegistry::from_json(const std::string& text, const std::string& src) {
  auto rp = std::make_unique<TenantRegistry>();
  TenantRegistry& r = *rp;
  r.tenants_.clear();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(src + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("keys") || !j["keys"].is_array() || j["keys"].empty())
    throw std::runtime_error(src + ": expected {\"keys\": [ ... ]} with at least one entry");
  size_t i = 0;
  for (const auto& k : j["keys"]) {
    const std::string where = src + ": keys[" + std::to_string(i++) + "]";
    if (!k.is_object()) throw std::runtime_error(where + " is not an object");
    auto str = [&](const char* f) -> std::string {
      if (!k.contains(f) || !k[f].is_string()) throw std::runtime_error(where + "." + f + " must be a string");
      return k[f].get<std::string>();
    };
    auto num = [&](const char* f, double def) -> double {
      if (!k.contains(f)) return def;
      if (!k[f].is_number() || k[f].get<double>() < 0)
        throw std::runtime_error(where + "." + f + " must be a non-negative number");
      return k[f].get<double>();
    };
    TenantKey tk;
    const std::string h = str("key_sha256");
    if (h.size() != 64) throw std::runtime_error(where + ".key_sha256 must be 64 hex digits (sha256 of the token)");
    for (size_t b = 0; b < 32; ++b) {
      const int hi = hexval(h[2 * b]), lo = hexval(h[2 * b + 1]);
      if (hi < 0 || lo < 0) throw std::runtime_error(where + ".key_sha256 has a non-hex character");
      tk.key_sha256[b] = uint8_t(hi * 16 + lo);
    }
    tk.tenant = str("tenant");
    if (tk.tenant.empty()) throw std::runtime_error(where + ".tenant must not be empty");
    TenantPolicy p;
    p.id = tk.tenant;
    p.permission_version = int64_t(num("permission_version", 1));
    if (k.contains("class")) {
      auto c = sched::parse_slo_class(str("class"));
      if (!c) throw std::runtime_error(where + ".class must be \"interactive\" or \"batch\"");
      p.slo = *c;
    }
    p.quota_blocks = int64_t(num("quota_blocks", 0));
    p.retention_s = num("retention_s", 0);
    if (k.contains("admin")) {
      if (!k["admin"].is_boolean()) throw std::runtime_error(where + ".admin must be true or false");
      p.admin = k["admin"].get<bool>();
    }
    // Several keys may name one tenant (key rotation); the policy is per
    // tenant, so entries that disagree are an error rather than a guess.
    auto it = r.tenants_.find(p.id);
    if (it != r.tenants_.end()) {
      const TenantPolicy& q = it->second.policy;
      if (q.permission_version != p.permission_version || q.slo != p.slo || q.quota_blocks != p.quota_blocks ||
          q.retention_s != p.retention_s || q.admin != p.admin)
        throw std::runtime_error(where + ": tenant '" + p.id + "' listed again with different settings");
    } else {
      r.tenants_[p.id].policy = p;
    }
    r.keys_.push_back(tk);
  }
  return rp;
}

std::unique_ptr<TenantRegistry> TenantRegistry::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("--api-keys: cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json(ss.str(), path);
}

std::optional<Caller> TenantRegistry::authenticate(const std::string& auth) const {
  std::string tenant;
  if (keys_.empty()) {
    tenant = kAnonymous;
  } else {
    // "Bearer" SP token; the scheme name is case-insensitive (RFC 7235).
    static const std::string kBearer = "bearer";
    if (auth.size() <= kBearer.size() + 1) return std::nullopt;
    for (size_t i = 0; i < kBearer.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(auth[i])) != kBearer[i]) return std::nullopt;
    if (auth[kBearer.size()] != ' ' && auth[kBearer.size()] != '\t') return std::nullopt;
    size_t b = kBearer.size();
    while (b < auth.size() && (auth[b] == ' ' || auth[b] == '\t')) ++b;
    size_t e = auth.size();
    while (e > b && (auth[e - 1] == ' ' || auth[e - 1] == '\t')) --e;
    if (e == b) return std::nullopt;
    const auto h = sha256(auth.substr(b, e - b));
    // Every entry is compared (no early exit): the time does not tell which
    // entry matched.
    int found = -1;
    for (size_t i = 0; i < keys_.size(); ++i)
      if (CRYPTO_memcmp(h.data(), keys_[i].key_sha256.data(), 32) == 0) found = int(i);
    if (found < 0) return std::nullopt;
    tenant = keys_[size_t(found)].tenant;
  }
  std::lock_guard lk(mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return std::nullopt;
  Caller c;
  c.policy = it->second.policy;
  c.tenant_hash = tenant_hash(tenant);
  return c;
}

void TenantRegistry::set_secret(const std::vector<uint8_t>& secret) {
  if (secret.size() < 16) throw std::runtime_error("--cache-secret-file: the secret must be at least 16 bytes");
  std::lock_guard lk(mu_);
  secret_ = secret;
}

Scope TenantRegistry::scope_for(const std::string& tenant, const std::string& model_identity, double now) {
  std::string msg = "kvserve-scope-v1";
  {
    std::lock_guard lk(mu_);
    State& s = tenants_[tenant];
    // Retention: a tenant whose blocks were all last touched more than
    // retention_s ago starts a new epoch, so those blocks never hit again
    // (the pool's LRU reclaims them). See docs/SERVER.md for the limits.
    if (s.policy.retention_s > 0 && s.last_use >= 0 && now - s.last_use > s.policy.retention_s) ++s.epoch;
    s.last_use = now;
    append_field(msg, tenant);
    append_u64(msg, uint64_t(s.policy.permission_version));
    append_field(msg, model_identity);
    append_u64(msg, uint64_t(s.epoch));
  }
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  std::vector<uint8_t> key;
  {
    std::lock_guard lk(mu_);
    key = secret_;
  }
  if (!HMAC(EVP_sha256(), key.data(), int(key.size()), reinterpret_cast<const unsigned char*>(msg.data()),
            msg.size(), mac, &mac_len))
    throw std::runtime_error("HMAC-SHA256 failed");
  const Scope scope = make_scope(model_identity, std::string_view(reinterpret_cast<const char*>(mac), mac_len));
  {
    std::lock_guard lk(mu_);
    std::vector<Scope>& v = tenants_[tenant].issued;
    if (std::find(v.begin(), v.end(), scope) == v.end()) {
      if (v.size() >= kMaxIssued) v.erase(v.begin());
      v.push_back(scope);
    }
  }
  return scope;
}

std::optional<int64_t> TenantRegistry::revoke(const std::string& tenant, std::vector<Scope>* retired) {
  std::lock_guard lk(mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return std::nullopt;
  if (retired) *retired = it->second.issued;
  it->second.issued.clear();
  return ++it->second.policy.permission_version;
}

std::optional<TenantPolicy> TenantRegistry::policy(const std::string& tenant) const {
  std::lock_guard lk(mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return std::nullopt;
  return it->second.policy;
}

bool TenantRegistry::try_reserve(const std::string& tenant, int64_t blocks) {
  std::lock_guard lk(mu_);
  State& s = tenants_[tenant];
  if (s.policy.quota_blocks > 0 && s.reserved_blocks + blocks > s.policy.quota_blocks) return false;
  s.reserved_blocks += blocks;
  return true;
}

void TenantRegistry::release(const std::string& tenant, int64_t blocks) {
  std::lock_guard lk(mu_);
  State& s = tenants_[tenant];
  s.reserved_blocks -= blocks;
  if (s.reserved_blocks < 0) s.reserved_blocks = 0;
}

int64_t TenantRegistry::reserved(const std::string& tenant) const {
  std::lock_guard lk(mu_);
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.reserved_blocks;
}

double TenantRegistry::longest_retention() const {
  std::lock_guard lk(mu_);
  double r = 0;
  for (const auto& [id, st] : tenants_) r = std::max(r, st.policy.retention_s);
  return r;
}

std::vector<TenantUsage> TenantRegistry::usage() const {
  std::vector<TenantUsage> out;
  if (keys_.empty()) return out;
  std::lock_guard lk(mu_);
  for (const auto& [id, st] : tenants_)
    out.push_back({tenant_hash(id), st.policy.quota_blocks, st.reserved_blocks, st.policy.admin});
  return out;
}

}  // namespace kvs::server
