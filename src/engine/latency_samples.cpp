#include "engine/latency_samples.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kvs {

LatencySamples::LatencySamples(size_t capacity) : cap_(capacity) {
  if (capacity == 0) throw std::invalid_argument("latency samples: capacity must be >= 1");
  ring_.reserve(capacity);
}

void LatencySamples::add(double s) {
  if (ring_.size() < cap_) {
    ring_.push_back(s);
  } else {
    ring_[next_] = s;
    next_ = (next_ + 1) % cap_;
  }
  ++total_;
}

double LatencySamples::quantile(double q) const {
  if (ring_.empty()) return 0;
  std::vector<double> v = ring_;
  q = std::clamp(q, 0.0, 1.0);
  // Nearest rank: the smallest sample with at least q of the samples at or below it.
  const size_t rank = std::max<size_t>(1, size_t(std::ceil(q * double(v.size()))));
  std::nth_element(v.begin(), v.begin() + long(rank - 1), v.end());
  return v[rank - 1];
}

void LatencySamples::clear() {
  ring_.clear();
  next_ = 0;
  total_ = 0;
}

}  // namespace kvs
