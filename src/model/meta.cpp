#include "model/meta.h"

namespace kvs::detail {

int meta_int(const GgufFile& f, const std::string& key, std::optional<int> def, int64_t lo, int64_t hi) {
  std::optional<uint64_t> v = f.opt_u64(key);
  if (!v) {
    if (def) return *def;
    throw ModelError(f.path() + ": required key '" + key + "' is missing");
  }
  if (*v < static_cast<uint64_t>(lo) || *v > static_cast<uint64_t>(hi))
    throw ModelError(f.path() + ": key '" + key + "' = " + std::to_string(*v) + " is out of range [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(*v);
}

float meta_float(const GgufFile& f, const std::string& key, float def, double lo, double hi) {
  const std::optional<double> v = f.opt_f64(key);
  if (!v) return def;
  if (!(*v > lo && *v < hi))
    throw ModelError(f.path() + ": key '" + key + "' = " + std::to_string(*v) + " is not in (" + std::to_string(lo) +
                     ", " + std::to_string(hi) + ")");
  return static_cast<float>(*v);
}

}  // namespace kvs::detail
