#include "kv/window_policy.h"

#include <algorithm>
#include <climits>
#include <stdexcept>

namespace kvs {

WindowView WindowPolicy::view(int p) const {
  WindowView v;
  switch (kind) {
    case WindowKind::None:
      break;
    case WindowKind::Native:
      v.win_start = std::max(0, p - window + 1);
      break;
    case WindowKind::Streaming:
      if (p - window + 1 > sinks) {
        v.sink_end = sinks;
        v.win_start = p - window + 1;
        v.shift = text_positions ? 0 : v.win_start - sinks;
      }
      break;
    case WindowKind::ContextShift: {
      // Token p is added to a cache holding p - D tokens; whenever it would
      // overflow C, n_discard = (C - keep) / 2 tokens after the kept ones go.
      const int nd = (ctx - keep) / 2;
      const int over = p + 1 - ctx;
      const int shifts = over > 0 ? (over + nd - 1) / nd : 0;
      v.sink_end = keep;
      v.win_start = keep + shifts * nd;
      v.shift = shifts * nd;
      break;
    }
  }
  return v;
}

int WindowPolicy::max_visible() const {
  switch (kind) {
    case WindowKind::None: return 0;
    case WindowKind::Native: return window;
    case WindowKind::Streaming: return sinks + window;
    case WindowKind::ContextShift: return ctx;
  }
  return 0;
}

void WindowPolicy::validate() const {
  switch (kind) {
    case WindowKind::None:
      return;
    case WindowKind::Native:
    case WindowKind::Streaming:
      if (window < 1) throw std::invalid_argument("--kv-window must be >= 1 token");
      if (sinks < 0) throw std::invalid_argument("--kv-sinks must be >= 0");
      return;
    case WindowKind::ContextShift:
      if (keep < 0 || ctx < 2 || (ctx - keep) / 2 < 1)
        throw std::invalid_argument("context shift needs a cache of at least n_keep + 2 tokens");
      return;
  }
}

int64_t window_block_cap(const WindowPolicy& w, int block_size, int max_step_tokens) {
  const int vis = w.max_visible();
  if (vis <= 0) return INT64_MAX;
  auto blocks = [&](int64_t tokens) { return (tokens + block_size - 1) / block_size; };
  return blocks(vis) + 2 + blocks(std::max(1, max_step_tokens));
}

bool TableWindow::dead(int64_t a, int64_t b, int p) const {
  if (b <= a) return true;
  // Hidden by the layer window: [0, m). By the policy: [lo, hi).
  const int64_t m = layer_window > 0 ? std::max<int64_t>(0, int64_t(p) - layer_window + 1) : 0;
  if (b <= m) return true;
  if (!policy.active()) return false;
  const auto [lo, hi] = policy.dead_range(p);
  if (lo >= hi) return false;
  if (a >= lo && b <= hi) return true;
  return lo <= m && b <= hi;  // the two ranges touch: [0, max(m, hi))
}

int64_t TableWindow::block_cap(int block_size, int max_step_tokens) const {
  const int64_t a = window_block_cap(policy, block_size, max_step_tokens);
  if (layer_window <= 0) return a;
  return std::min(a, window_block_cap(WindowPolicy::native(layer_window), block_size, max_step_tokens));
}

std::vector<TableWindow> table_windows(const WindowPolicy& policy, const KvGroups& groups) {
  std::vector<TableWindow> tw;
  for (const KvGroups::Table& t : groups.tables) tw.push_back({policy, t.window});
  if (tw.empty()) tw.push_back({policy, 0});
  return tw;
}

int64_t sequence_block_cap(const std::vector<TableWindow>& tables, int64_t tokens, int block_size,
                           int max_step_tokens) {
  const int64_t all = (tokens + block_size - 1) / block_size;
  int64_t sum = 0;
  for (const TableWindow& t : tables) sum += std::min(all, t.block_cap(block_size, max_step_tokens));
  return sum;
}

std::string WindowPolicy::describe() const {
  switch (kind) {
    case WindowKind::None: return "none";
    case WindowKind::Native: return "native window " + std::to_string(window);
    case WindowKind::Streaming:
      return (sinks ? std::to_string(sinks) + " sinks + window " + std::to_string(window) : "window " + std::to_string(window)) +
             (text_positions ? ", text positions" : "");
    case WindowKind::ContextShift:
      return "context shift (cache " + std::to_string(ctx) + ", keep " + std::to_string(keep) + ")";
  }
  return "?";
}

}  // namespace kvs
