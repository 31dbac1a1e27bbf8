#include "engine/kv_cache.h"

#include <algorithm>

#include "kvserve/engine.h"
#include "model/model.h"

namespace kvs {

KvLayout kv_layout_for(const Engine& e, int bs, const KvCacheOptions& cache) {
  const ModelConfig& c = e.model().config();
  KvLayout l{c.n_layers, c.n_kv_heads, c.head_dim, bs};
  l.type = cache.type;
  l.key_scale = cache.key_scale;
  l.group_tokens = cache.residual > 0 ? cache.residual : bs;
  l.group_channels = cache.group_channels;
  const std::vector<int>& lw = c.layer_window;
  const bool one_window = lw.empty() || std::all_of(lw.begin(), lw.end(), [&](int w) { return w == lw[0]; });
  if (cache.hybrid && !lw.empty()) l.groups = KvGroups::by_window(lw);
  else l.groups = KvGroups::uniform(c.n_layers, one_window && !lw.empty() ? lw[0] : 0);
  l.validate();
  return l;
}

}  // namespace kvs
