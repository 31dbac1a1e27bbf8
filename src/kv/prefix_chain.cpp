#include "kv/prefix_chain.h"

namespace kvs {

std::vector<BlockKey> chain_keys(std::span<const int32_t> tokens, int block_size, const Scope& scope,
                                 int64_t max_blocks) {
  std::vector<BlockKey> keys;
  walk_chain(tokens, block_size, scope, [&](int64_t i, const BlockKey& k) {
    if (i >= max_blocks) return false;
    keys.push_back(k);
    return true;
  });
  return keys;
}

Scope kv_scope(std::string_view model_identity, const Scope& caller) {
  const std::string_view bytes(reinterpret_cast<const char*>(caller.bytes.data()), caller.bytes.size());
  return make_scope(model_identity, bytes);
}

std::string prefix_key_protocol() {
  // Two blocks of four tokens under a fixed caller scope and model name:
  // any change to the key, the scope binding or the chain changes the hex.
  static const std::string fp = [] {
    Scope caller;
    for (size_t i = 0; i < caller.bytes.size(); ++i) caller.bytes[i] = uint8_t(i);
    const int32_t probe[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const std::vector<BlockKey> keys = chain_keys(probe, 4, kv_scope("kvserve-probe-model", caller));
    return "kv-prefix-v1:" + to_hex(keys.back()).substr(0, 16);
  }();
  return fp;
}

}  // namespace kvs
