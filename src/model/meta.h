// Internal to src/model: typed, range-checked reads of architecture keys
// (every failure a ModelError naming the key).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "model/gguf.h"

namespace kvs::detail {

// Integer `key`: required unless `def` is given; must lie in [lo, hi].
int meta_int(const GgufFile& f, const std::string& key, std::optional<int> def, int64_t lo, int64_t hi);
// Float `key` (any numeric type) or `def`; must lie in (lo, hi).
float meta_float(const GgufFile& f, const std::string& key, float def, double lo, double hi);

}  // namespace kvs::detail
