// Disaggregated serving: which prefill worker and which decode worker serve
// one request. Any prefill worker may hand to any decode worker whose KV
// address (from its /health) is among the prefill worker's decode peers
// (from its /health, i.e. its --decode-peer flags), spelt alike or
// resolving to a common address (router/peer_address.h); of those pairs, both
// up, the one with the least load (the prefill worker's plus the decode
// worker's) wins, ties rotating with `turn`.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "router/workers.h"

namespace kvs::router {

struct PdChoice {
  int prefill = -1, decode = -1;  // indices into the WorkerSet
  std::string decode_kv;          // the prefill worker's --decode-peer entry for it, for ?kv_decode_peer=
};

// `prefill` and `decode`: worker indices of each role. Empty when no pair
// is usable; then *why (if given) says what is missing.
std::optional<PdChoice> choose_pd(const std::vector<WorkerView>& view, const std::vector<int>& prefill,
                                  const std::vector<int>& decode, uint64_t turn, std::string* why = nullptr);

}  // namespace kvs::router
