#include "cli/kv_tier_args.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>

#include "crypto/kdf.h"
#include "crypto/private_file.h"
#include "crypto/user_home.h"
#include "tiers/disk_store.h"
#include "tiers/redis_store.h"
#include "tiers/sealed_block.h"
#include "tools/units.h"

namespace kvs::cli {

void add_kv_tier_args(CLI::App* c, KvTierArgs& a) {
  a.disk_opt = c->add_option(
      "--kv-disk", a.disk_dir,
      "Directory of the encrypted disk KV tier: evicted and computed prefix blocks survive here, across restarts");
  a.tier_only.push_back(
      c->add_option("--kv-disk-size", a.disk_size, "Capacity of the disk tier (e.g. 20GiB)")->capture_default_str());
  a.redis_opt = c->add_option("--kv-redis", a.redis_url,
                              "Redis KV tier shared by replicas: redis://[[USER]:PASSWORD@]HOST:PORT[/DB] (replicas "
                              "must share --kv-key-file; give a password in --kv-redis-password-file, as a URL "
                              "shows in ps)");
  a.redis_password_opt = c->add_option("--kv-redis-password-file", a.redis_password_file,
                                       "File (mode 0600) holding the password of the --kv-redis server (AUTH; the "
                                       "user name, if any, goes in the URL: redis://USER@HOST:PORT)");
  a.tier_only.push_back(c->add_option(
      "--kv-key-file", a.key_file,
      "Master key of the KV tiers (created 0600 on first run; default ~/.config/kvserve/kv-tier.key)"));
  a.tier_only.push_back(c->add_option("--kv-retention", a.retention_s,
                                      "Seconds a tier keeps a block of a tenant without retention_s in --api-keys")
                            ->capture_default_str()
                            ->check(CLI::Range(1.0, 1e9)));
  a.tier_only.push_back(
      c->add_option("--kv-tier-queue", a.queue, "Most block bytes waiting to be written behind (more are dropped)")
          ->capture_default_str());
}

// A tier's options without a tier, or a tier named by an empty value,
// would leave the server without the tier the user asked for, silently.
static void check_tier_options(const KvTierArgs& a) {
  for (const CLI::Option* o : {a.disk_opt, a.redis_opt})
    if (o && o->count() > 0 && o->as<std::string>().empty())
      throw std::runtime_error(o->get_name() + " is empty: give a " +
                               (o == a.disk_opt ? "folder" : "redis://HOST:PORT") + ", or leave the option out");
  if (a.redis_password_opt && a.redis_password_opt->count() > 0 && a.redis_url.empty())
    throw std::runtime_error("--kv-redis-password-file is the password of the --kv-redis server, and no --kv-redis "
                             "is given: add --kv-redis redis://HOST:PORT, or leave it out");
  if (a.any()) return;
  for (const CLI::Option* o : a.tier_only)
    if (o->count() > 0)
      throw std::runtime_error(o->get_name() + " configures a KV tier, and none is on: add --kv-disk DIR or " +
                               "--kv-redis redis://HOST:PORT, or leave it out");
}

static std::string default_key_path() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  const std::string base = xdg && *xdg ? xdg : crypto::user_home("--kv-key-file") + "/.config";
  return base + "/kvserve/kv-tier.key";
}

static uint64_t size_flag(const char* flag, const std::string& v) {
  try {
    return tools::parse_size(v);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(flag) + ": " + e.what());
  }
}

std::optional<crypto::SecretKey> tier_master_key(const KvTierArgs& a, bool prefix_cache) {
  check_tier_options(a);
  if (!a.any()) return std::nullopt;
  // The tiers keep prefix blocks under their prefix keys: without the
  // prefix cache nothing is ever keyed, so nothing would be stored.
  if (!prefix_cache)
    throw std::runtime_error("--kv-disk / --kv-redis store prefix-cache blocks, and --no-prefix-cache turns that "
                             "cache off: the tier would store nothing; drop one of them");
  // Every tier flag is checked before the model loads.
  size_flag("--kv-disk-size", a.disk_size);
  size_flag("--kv-tier-queue", a.queue);
  if (!a.redis_url.empty()) redis_endpoint(a);
  const std::string path = a.key_file.empty() ? default_key_path() : a.key_file;
  if (a.key_file.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  }
  bool created = false;
  try {
    crypto::SecretKey k = crypto::load_or_create_key_file(path, &created);
    if (created) std::fprintf(stderr, "kvserve: created the KV tier master key %s (mode 0600); keep it, or the tier's entries are lost\n", path.c_str());
    return k;
  } catch (const crypto::KeyFileError& e) {
    throw std::runtime_error(std::string("--kv-key-file: ") + e.what());
  }
}

// The password file: its text up to a final line end. One line only: a
// second line means the wrong file (or a user name, which goes in the URL).
static std::string read_password_file(const std::string& path) {
  std::string text;
  try {
    text = crypto::read_private_file(path, "password file", 4096);
  } catch (const crypto::KeyFileError& e) {
    throw std::runtime_error(std::string("--kv-redis-password-file: ") + e.what());
  }
  if (text.size() >= 4096) throw std::runtime_error("--kv-redis-password-file " + path + ": longer than 4 KiB; is it the password?");
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) throw std::runtime_error("--kv-redis-password-file " + path + " is empty; write the password in it");
  if (text.find_first_of("\r\n") != std::string::npos)
    throw std::runtime_error("--kv-redis-password-file " + path + " holds more than one line; it must hold only the "
                             "password (a user name goes in --kv-redis: redis://USER@HOST:PORT)");
  return text;
}

tiers::RedisEndpoint redis_endpoint(const KvTierArgs& a) {
  tiers::RedisEndpoint ep;
  try {
    ep = tiers::parse_redis_url(a.redis_url);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  if (!a.redis_password_file.empty()) {
    if (!ep.password.empty())
      throw std::runtime_error("--kv-redis holds a password and --kv-redis-password-file gives one too: keep only "
                               "the file (a URL shows in ps)");
    ep.password = read_password_file(a.redis_password_file);
  }
  if (!ep.user.empty() && ep.password.empty())
    throw std::runtime_error("--kv-redis names the user '" + ep.user + "' without a password: give it in "
                             "--kv-redis-password-file FILE");
  return ep;
}

std::vector<uint8_t> tier_scope_secret(const crypto::SecretKey& master) {
  const crypto::SecretKey s = crypto::derive_key(master, "prefix-cache-scope-secret");
  return {s.span().begin(), s.span().end()};
}

std::unique_ptr<tiers::TierSet> start_tiers(const KvTierArgs& a, const crypto::SecretKey& master,
                                            const std::string& model_identity, const KvLayout& layout,
                                            double longest_retention_s) {
  auto log = [](const std::string& s) { std::fprintf(stderr, "kvserve: %s\n", s.c_str()); };
  std::vector<std::unique_ptr<tiers::BlobStore>> stores;
  const double longest = std::max(a.retention_s, longest_retention_s);
  if (!a.disk_dir.empty()) {
    const uint64_t size = size_flag("--kv-disk-size", a.disk_size);
    // Checked before the store opens: it would delete entries to fit.
    if (size < tiers::sealed_bytes(layout.block_bytes()))
      throw std::runtime_error("--kv-disk-size " + a.disk_size + " is below one entry of this model's KV (" +
                               std::to_string(tiers::sealed_bytes(layout.block_bytes())) +
                               " bytes): nothing could be stored; give a larger size, or leave --kv-disk out");
    auto disk = std::make_unique<tiers::DiskStore>(a.disk_dir, int64_t(size), int64_t(std::time(nullptr)), log);
    std::array<uint8_t, 8> id{};
    crypto::fingerprint(master.span(), id, "kvserve disk tier key id");
    disk->note_key(tiers::hex(id));
    disk->cap_retention(longest, int64_t(std::time(nullptr)));
    stores.push_back(std::move(disk));
  }
  if (!a.redis_url.empty()) {
    tiers::RedisOptions ro;
    ro.max_ttl_s = longest;
    if (!a.redis_password_file.empty())
      ro.password_source = [path = a.redis_password_file] { return read_password_file(path); };
    auto redis = std::make_unique<tiers::RedisStore>(redis_endpoint(a), ro, log);
    // A refused login or database does not heal by retrying: stop here.
    if (!redis->refused().empty())
      throw std::runtime_error("--kv-redis " + tiers::redis_url_for_logs(a.redis_url) + ": " + redis->refused());
    stores.push_back(std::move(redis));
  }
  tiers::TierSetOptions o;
  o.default_retention_s = a.retention_s;
  o.queue_bytes = int64_t(size_flag("--kv-tier-queue", a.queue));
  // A queue that cannot hold one block drops every write.
  if (o.queue_bytes < int64_t(layout.block_bytes()))
    throw std::runtime_error("--kv-tier-queue " + a.queue + " is below one block of this model's KV (" +
                             std::to_string(layout.block_bytes()) + " bytes): every write would be dropped");
  const std::string desc = layout.describe() + " block " + std::to_string(layout.block_size) + " layers " +
                           std::to_string(layout.n_layers) + " kv heads " + std::to_string(layout.n_kv_heads) +
                           " head dim " + std::to_string(layout.head_dim) + " bytes " +
                           std::to_string(layout.block_bytes());
  return std::make_unique<tiers::TierSet>(master, tiers::make_tier_identity(model_identity, desc, layout.block_bytes()),
                                          std::move(stores), o, log);
}

}  // namespace kvs::cli
