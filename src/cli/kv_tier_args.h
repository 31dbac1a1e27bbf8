// The KV tier flags of `kvserve serve` (docs/KV.md, "Tiers") and the tier set
// they build.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "crypto/secret_key.h"
#include "kernels/kv_layout.h"
#include "tiers/redis_url.h"
#include "tiers/tier_set.h"

namespace kvs::cli {

struct KvTierArgs {
  std::string disk_dir, disk_size = "10GiB", redis_url, redis_password_file, key_file;
  double retention_s = 86400;
  std::string queue = "256MiB";
  bool any() const { return !disk_dir.empty() || !redis_url.empty(); }
  // The options as parsed (add_kv_tier_args): a tier's own options given
  // without a tier would be ignored, so they are refused.
  std::vector<const CLI::Option*> tier_only;
  const CLI::Option* disk_opt = nullptr;
  const CLI::Option* redis_opt = nullptr;
  const CLI::Option* redis_password_opt = nullptr;
};
void add_kv_tier_args(CLI::App* cmd, KvTierArgs& a);

// The master key (created on first use) when a tier is on. Throws with a
// message naming the flag for a key file that must not be used.
// `prefix_cache`: whether the server keys blocks at all (--no-prefix-cache).
std::optional<crypto::SecretKey> tier_master_key(const KvTierArgs& a, bool prefix_cache);
// Where the Redis tier connects and as whom: --kv-redis and the password in
// --kv-redis-password-file. Throws naming the flag at fault.
tiers::RedisEndpoint redis_endpoint(const KvTierArgs& a);
// The prefix-cache scope secret derived from the master key: stable across
// restarts and equal on replicas that share the key file, so their scopes
// (and so their tier entries) match.
std::vector<uint8_t> tier_scope_secret(const crypto::SecretKey& master);
// `longest_retention_s`: the most any tenant keeps (--kv-retention, or a
// longer retention_s in --api-keys): entries written under a longer one are
// capped to it.
std::unique_ptr<tiers::TierSet> start_tiers(const KvTierArgs& a, const crypto::SecretKey& master,
                                            const std::string& model_identity, const KvLayout& layout,
                                            double longest_retention_s);

}  // namespace kvs::cli
