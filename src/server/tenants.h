// Who is calling, and which slice of the prefix cache they may see.
//
// --api-keys FILE (JSON):
//   {"keys": [{"key_sha256": "<hex sha256 of the bearer token>", "tenant": "a",
//              "permission_version": 1, "class": "interactive",
//              "quota_blocks": 0, "retention_s": 3600, "admin": false}]}
// Only hashes of keys are ever held; a bearer token is hashed and compared
// against every entry with CRYPTO_memcmp (no early exit, no timing hint of
// which entry or how many bytes matched). Without the file there is one
// anonymous tenant and no authentication.
//
// The prefix-cache scope of a request is derived here, never taken from the
// client: HMAC-SHA256(server secret, tenant ‖ permission version ‖ model ‖
// retention epoch), folded with the model identity by kvs::make_scope. Equal
// token prefixes under another tenant, another permission version (after a
// revoke) or after the retention TTL therefore never resolve to the same
// blocks.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/prefix_hash.h"
#include "sched/request.h"

namespace kvs::server {

struct TenantKey {
  std::array<uint8_t, 32> key_sha256{};
  std::string tenant;
};

struct TenantPolicy {
  std::string id;
  int64_t permission_version = 1;
  sched::SloClass slo = sched::SloClass::Interactive;
  int64_t quota_blocks = 0;  // 0 = no per-tenant quota
  double retention_s = 0;    // 0 = cached blocks never expire by age
  bool admin = false;
};

// The caller of one request, as resolved by authenticate().
struct Caller {
  TenantPolicy policy;  // copy at the time of the request
  std::string tenant_hash;  // hex, first 16 chars of sha256(tenant): logs and labels only
};

// One tenant as the dashboard shows it: never the id, only its hash.
struct TenantUsage {
  std::string hash;             // tenant_hash(id)
  int64_t quota_blocks = 0;     // the key file's quota_blocks (0: none)
  int64_t reserved_blocks = 0;  // worst case of its requests in flight now
  bool admin = false;
};

class TenantRegistry {
 public:
  // No file: one anonymous tenant ("anonymous"), no auth.
  TenantRegistry();
  // Parses the api-keys JSON text; throws std::runtime_error with the field
  // that is wrong (the key itself is never echoed).
  static std::unique_ptr<TenantRegistry> from_json(const std::string& text, const std::string& source_name);
  static std::unique_ptr<TenantRegistry> from_file(const std::string& path);

  bool auth_required() const { return !keys_.empty(); }
  // Resolves "Authorization: Bearer <token>" (the full header value; the
  // scheme in any case).
  // nullopt: missing or unknown key.
  std::optional<Caller> authenticate(const std::string& authorization_header) const;

  // 32 random bytes (per process), or the bytes of --cache-secret-file.
  void set_secret(const std::vector<uint8_t>& secret);
  // The prefix-cache scope of `tenant` for `model_identity` at time `now`
  // (monotonic seconds; drives the retention epoch). Thread-safe.
  Scope scope_for(const std::string& tenant, const std::string& model_identity, double now);

  // Bumps the tenant's permission version: every block cached under the old
  // scope misses from now on. Returns the new version, nullopt if unknown.
  // `retired` (optional) receives the scopes scope_for handed out under the
  // old version (the most recent few), for the server to drop their blocks.
  std::optional<int64_t> revoke(const std::string& tenant, std::vector<Scope>* retired = nullptr);
  std::optional<TenantPolicy> policy(const std::string& tenant) const;

  // Per-tenant block quota, enforced by the server on the worst-case blocks
  // of its in-flight requests. try_reserve returns false when over quota.
  bool try_reserve(const std::string& tenant, int64_t blocks);
  void release(const std::string& tenant, int64_t blocks);
  int64_t reserved(const std::string& tenant) const;
  // Every tenant of the key file (none without one), by hash.
  std::vector<TenantUsage> usage() const;
  // The longest retention_s any tenant has (0: none sets one).
  double longest_retention() const;

 private:
  struct State {
    TenantPolicy policy;
    double last_use = -1;       // monotonic seconds of the last scope_for
    int64_t epoch = 0;          // bumped when the tenant idled past retention_s
    int64_t reserved_blocks = 0;
    std::vector<Scope> issued;  // scopes handed out under the current version (last kMaxIssued)
  };
  static constexpr size_t kMaxIssued = 16;
  std::vector<TenantKey> keys_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, State> tenants_;
  std::vector<uint8_t> secret_;
};

// Lowercase hex SHA-256 of `s`.
std::string sha256_hex(const std::string& s);
// First 16 hex chars of sha256(tenant id): the only form a tenant appears in
// logs and metrics.
std::string tenant_hash(const std::string& tenant);
// Random bytes from the OS CSPRNG (OpenSSL RAND_bytes); throws on failure.
std::vector<uint8_t> random_secret(size_t n = 32);

}  // namespace kvs::server
