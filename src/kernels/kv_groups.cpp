#include "kernels/kv_groups.h"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace kvs {

KvGroups KvGroups::uniform(int n_layers, int window) {
  if (n_layers < 1) throw std::invalid_argument("KV groups: a model needs at least one layer");
  KvGroups g;
  g.n_layers = n_layers;
  g.slots = n_layers;
  g.tables.push_back({window, {}});
  for (int l = 0; l < n_layers; ++l) {
    g.tables[0].layers.push_back(l);
    g.table_of.push_back(0);
    g.slot_of.push_back(l);
  }
  return g;
}

KvGroups KvGroups::by_window(const std::vector<int>& layer_window) {
  if (layer_window.empty()) throw std::invalid_argument("KV groups: a model needs at least one layer");
  std::map<int, std::vector<int>> groups;  // window -> layers; 0 (full attention) sorts first
  for (int l = 0; l < int(layer_window.size()); ++l) {
    if (layer_window[size_t(l)] < 0)
      throw std::invalid_argument("KV groups: layer " + std::to_string(l) + " has a negative window");
    groups[layer_window[size_t(l)]].push_back(l);
  }
  const int n = int(layer_window.size());
  if (groups.size() == 1) return uniform(n, groups.begin()->first);
  KvGroups g;
  g.n_layers = n;
  g.slots = n;
  for (const auto& [w, ls] : groups) g.slots = std::min(g.slots, int(ls.size()));
  g.table_of.assign(size_t(n), -1);
  g.slot_of.assign(size_t(n), -1);
  for (const auto& [w, ls] : groups)
    for (size_t i = 0; i < ls.size(); ++i) {
      if (i % size_t(g.slots) == 0) g.tables.push_back({w, {}});
      g.table_of[size_t(ls[i])] = g.n_tables() - 1;
      g.slot_of[size_t(ls[i])] = int(g.tables.back().layers.size());
      g.tables.back().layers.push_back(ls[i]);
    }
  return g;
}

std::vector<int> KvGroups::table_windows() const {
  std::vector<int> w;
  for (const Table& t : tables) w.push_back(t.window);
  return w;
}

std::string KvGroups::describe() const {
  std::string s = std::to_string(tables.size()) + (tables.size() == 1 ? " table x " : " tables x ") +
                  std::to_string(slots) + " slots:";
  for (size_t t = 0; t < tables.size(); ++t) {
    s += (t ? " | w" : " w") + std::to_string(tables[t].window) + " {";
    for (size_t i = 0; i < tables[t].layers.size(); ++i) s += (i ? "," : "") + std::to_string(tables[t].layers[i]);
    s += "}";
  }
  return s;
}

}  // namespace kvs
