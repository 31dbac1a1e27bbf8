// The most recent per-token times of one run (time per output token), kept
// in a fixed-size ring so an unbounded chat holds constant memory; exact
// quantiles over what is kept. Used by `kvserve chat` (/stats) and
// `kvserve bench --throttle`.
#pragma once
#include <cstddef>
#include <vector>

namespace kvs {

class LatencySamples {
 public:
  explicit LatencySamples(size_t capacity = 4096);
  void add(double seconds);
  // Nearest-rank quantile (q in [0, 1]) of the kept samples; 0 when empty.
  double quantile(double q) const;
  size_t size() const { return ring_.size(); }
  size_t total() const { return total_; }  // every sample ever added
  void clear();

 private:
  size_t cap_, next_ = 0, total_ = 0;
  std::vector<double> ring_;
};

}  // namespace kvs
