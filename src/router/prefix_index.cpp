#include "router/prefix_index.h"

namespace kvs::router {

void PrefixIndex::add(int w, uint64_t h) { holders_[h] |= uint64_t(1) << w; }

void PrefixIndex::remove(int w, uint64_t h) {
  auto it = holders_.find(h);
  if (it == holders_.end()) return;
  it->second &= ~(uint64_t(1) << w);
  if (it->second == 0) holders_.erase(it);
}

void PrefixIndex::apply(int w, const events::WireBatch& batch) {
  if (w < 0 || w >= kMaxWorkers) return;
  std::lock_guard lk(mu_);
  for (const events::WireEvent& e : batch.events) {
    switch (e.kind) {
      case events::WireEvent::Kind::Stored:
        for (uint64_t h : e.hashes) add(w, h);
        break;
      case events::WireEvent::Kind::Removed:
        for (uint64_t h : e.hashes) remove(w, h);
        break;
      case events::WireEvent::Kind::Cleared:
        for (auto it = holders_.begin(); it != holders_.end();) {
          it->second &= ~(uint64_t(1) << w);
          it = it->second == 0 ? holders_.erase(it) : std::next(it);
        }
        break;
    }
  }
}

void PrefixIndex::predict(int w, const std::vector<uint64_t>& hashes) {
  if (w < 0 || w >= kMaxWorkers) return;
  std::lock_guard lk(mu_);
  for (uint64_t h : hashes) add(w, h);
}

void PrefixIndex::clear_worker(int w) {
  events::WireBatch b;
  b.events.push_back({events::WireEvent::Kind::Cleared, {}, std::nullopt, 0});
  apply(w, b);
}

std::vector<int> PrefixIndex::leading_hits(const std::vector<uint64_t>& hashes, int n_workers) const {
  std::vector<int> hits(size_t(n_workers), 0);
  uint64_t alive = n_workers >= 64 ? ~uint64_t(0) : (uint64_t(1) << n_workers) - 1;
  std::lock_guard lk(mu_);
  for (uint64_t h : hashes) {
    auto it = holders_.find(h);
    alive &= it == holders_.end() ? 0 : it->second;
    if (!alive) break;
    for (int w = 0; w < n_workers; ++w)
      if (alive >> w & 1) ++hits[size_t(w)];
  }
  return hits;
}

size_t PrefixIndex::size() const {
  std::lock_guard lk(mu_);
  return holders_.size();
}

}  // namespace kvs::router
