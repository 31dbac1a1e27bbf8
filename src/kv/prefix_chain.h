// The chain of block keys of a token sequence (kv/prefix_hash.h), walked in
// one place. Every holder of prefix keys walks it through here: the KV
// manager (admission, adoption, probes, keying newly full blocks, tier
// imports), tier prefetch, the disaggregation handshake and the router's
// request hasher. A second hand-written walk could disagree with this one
// and turn every hit into a silent miss, so there is none; the protocol
// fingerprint below lets two processes check they walk it the same way.
#pragma once
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/prefix_hash.h"

namespace kvs {

// Visits the keys of `tokens`' full blocks from block `from` on, in order,
// while visit(i, key_i) returns true. `parent` is the key of block from - 1
// (ignored when from == 0). Returns the number of blocks for which visit
// returned true.
template <class Visit>
int64_t walk_chain(std::span<const int32_t> tokens, int block_size, const Scope& scope, Visit&& visit,
                   int64_t from = 0, const BlockKey* parent = nullptr) {
  BlockKey k = parent && from > 0 ? *parent : BlockKey{};
  int64_t n = 0;
  for (int64_t i = from; (i + 1) * int64_t(block_size) <= int64_t(tokens.size()); ++i) {
    k = block_key(i ? &k : nullptr, tokens.data() + i * block_size, block_size, scope);
    if (!visit(i, k)) break;
    ++n;
  }
  return n;
}

// The key under which KV table `table` (kernels/kv_groups.h) indexes its
// physical block of a logical block whose chain key is `chain_key`: table 0
// uses the chain key itself (so the router, the KV events and every
// one-table model see the keys they always did), a later table a keyed
// derivation of (chain key, table), so each table's block is found on its own.
inline BlockKey table_key(const BlockKey& chain_key, int table) {
  return table == 0 ? chain_key : table_block_key(chain_key, table);
}

// The keys of the first `max_blocks` full blocks.
std::vector<BlockKey> chain_keys(std::span<const int32_t> tokens, int block_size, const Scope& scope,
                                 int64_t max_blocks = INT64_MAX);

// The scope a KV pool keys a caller's blocks with: the caller's scope (the
// server's per-tenant HMAC) bound to the model identity. The one place that
// binds them; the workers and the router both call it.
Scope kv_scope(std::string_view model_identity, const Scope& caller);

// A fingerprint of the whole key protocol (block key, scope binding, chain):
// a version tag and the key of a fixed probe chain. Workers report it on
// /health, the router refuses a worker whose fingerprint is not its own.
std::string prefix_key_protocol();

}  // namespace kvs
