#include "kv/prefix_hash.h"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <vector>

namespace kvs {
namespace {

struct CtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

// One digest context per thread, reused: EVP_MD_CTX_new per block would cost
// an allocation per key on the admission path.
EVP_MD_CTX* thread_ctx() {
  thread_local std::unique_ptr<EVP_MD_CTX, CtxDeleter> ctx(EVP_MD_CTX_new());
  if (!ctx) throw std::runtime_error("prefix hash: EVP_MD_CTX_new failed");
  return ctx.get();
}

class Sha256 {
 public:
  Sha256() : c_(thread_ctx()) {
    if (EVP_DigestInit_ex(c_, EVP_sha256(), nullptr) != 1) throw std::runtime_error("prefix hash: SHA-256 init failed");
  }
  void update(const void* p, size_t n) {
    if (n && EVP_DigestUpdate(c_, p, n) != 1) throw std::runtime_error("prefix hash: SHA-256 update failed");
  }
  void update_u64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = uint8_t(v >> (8 * i));
    update(b, 8);
  }
  std::array<uint8_t, 32> finish() {
    std::array<uint8_t, 32> out{};
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(c_, out.data(), &len) != 1 || len != 32)
      throw std::runtime_error("prefix hash: SHA-256 final failed");
    return out;
  }

 private:
  EVP_MD_CTX* c_;
};

}  // namespace

Scope make_scope(std::string_view model_identity, std::string_view caller_bytes) {
  static constexpr char kTag[] = "kvserve/kv-scope/v1";
  Sha256 h;
  h.update(kTag, sizeof kTag - 1);
  h.update_u64(model_identity.size());
  h.update(model_identity.data(), model_identity.size());
  h.update_u64(caller_bytes.size());
  h.update(caller_bytes.data(), caller_bytes.size());
  Scope s;
  s.bytes = h.finish();
  return s;
}

BlockKey block_key(const BlockKey* parent, const int32_t* tokens, int block_size, const Scope& scope) {
  if (block_size < 1 || !tokens) throw std::invalid_argument("block_key: need block_size >= 1 tokens");
  static const BlockKey kRoot{};  // parent of block 0
  Sha256 h;
  h.update((parent ? *parent : kRoot).data(), 32);
  // Tokens as int32 little-endian, whatever the host order, so keys are
  // portable (a future on-disk / cross-host cache can trust them).
  uint8_t buf[4 * 64];
  for (int i = 0; i < block_size;) {
    const int n = std::min(64, block_size - i);
    for (int j = 0; j < n; ++j) {
      const uint32_t v = uint32_t(tokens[i + j]);
      buf[4 * j + 0] = uint8_t(v);
      buf[4 * j + 1] = uint8_t(v >> 8);
      buf[4 * j + 2] = uint8_t(v >> 16);
      buf[4 * j + 3] = uint8_t(v >> 24);
    }
    h.update(buf, size_t(4 * n));
    i += n;
  }
  h.update(scope.bytes.data(), scope.bytes.size());
  return h.finish();
}

BlockKey table_block_key(const BlockKey& chain_key, int table) {
  if (table < 0) throw std::invalid_argument("table_block_key: negative table");
  static constexpr char kTag[] = "kvserve/kv-table/v1";
  Sha256 h;
  h.update(kTag, sizeof kTag - 1);
  h.update(chain_key.data(), chain_key.size());
  h.update_u64(uint64_t(table));
  return h.finish();
}

std::string to_hex(const BlockKey& k) {
  static const char* d = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < k.size(); ++i) {
    s[2 * i] = d[k[i] >> 4];
    s[2 * i + 1] = d[k[i] & 15];
  }
  return s;
}

}  // namespace kvs
