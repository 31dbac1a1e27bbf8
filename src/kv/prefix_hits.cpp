#include "kv/prefix_hits.h"

#include <algorithm>

namespace kvs {

int64_t cached_tokens_for_hit(int64_t h, int64_t n, int bs, int align) {
  const int64_t c = h * bs;
  return c == n && n > 0 ? (n - 1) / align * align : c;
}

bool hit_needs_block(const TableWindow& w, int64_t i, int64_t cached, int bs) {
  if (i * bs >= cached) return false;
  return !w.frees() || !w.dead(i * bs, (i + 1) * bs, int(cached));
}

namespace {

// Every block table `w` needs at `cached` tokens is available.
bool table_allows(const TableWindow& w, const std::vector<uint8_t>& avail, int64_t cached, int bs) {
  const int64_t keep = (cached + bs - 1) / bs;
  // Under a layer window alone the hidden blocks are a prefix: start past it.
  int64_t i = 0;
  if (!w.policy.active() && w.layer_window > 0) i = std::max<int64_t>(0, cached - w.layer_window + 1) / bs;
  for (; i < keep; ++i)
    if (!avail[size_t(i)] && hit_needs_block(w, i, cached, bs)) return false;
  return true;
}

}  // namespace

int64_t largest_hit(const std::vector<TableWindow>& tables, const std::vector<std::vector<uint8_t>>& avail,
                    int64_t n, int bs, int align) {
  if (tables.empty()) return 0;
  int64_t h = int64_t(avail[0].size());
  // A table that frees nothing needs every block: its available prefix bounds h.
  for (size_t t = 0; t < tables.size(); ++t)
    if (!tables[t].frees()) h = std::min<int64_t>(h, std::find(avail[t].begin(), avail[t].end(), 0) - avail[t].begin());
  for (; h > 0; --h) {
    const int64_t cached = cached_tokens_for_hit(h, n, bs, align);
    bool ok = true;
    for (size_t t = 0; t < tables.size() && ok; ++t)
      ok = !tables[t].frees() || table_allows(tables[t], avail[t], cached, bs);
    if (ok) return h;
  }
  return 0;
}

}  // namespace kvs
