#include "router/pd_choice.h"

#include <algorithm>

namespace kvs::router {

std::optional<PdChoice> choose_pd(const std::vector<WorkerView>& view, const std::vector<int>& prefill,
                                  const std::vector<int>& decode, uint64_t turn, std::string* why) {
  std::optional<PdChoice> best;
  double best_load = 0;
  bool any_prefill = false, any_decode = false;
  const size_t np = prefill.size(), nd = decode.size();
  // Rotating both starting points spreads equal-load pairs over every
  // worker of each role.
  for (size_t a = 0; a < np; ++a) {
    const int p = prefill[(turn + a) % np];
    const WorkerView& pv = view[size_t(p)];
    if (!pv.up) continue;
    any_prefill = true;
    for (size_t b = 0; b < nd; ++b) {
      const int d = decode[(turn + b) % nd];
      const WorkerView& dv = view[size_t(d)];
      if (!dv.up || dv.kv_listen.empty()) continue;
      any_decode = true;
      if (std::find(pv.decode_peers.begin(), pv.decode_peers.end(), dv.kv_listen) == pv.decode_peers.end()) continue;
      const double load = pv.load + dv.load;
      if (!best || load < best_load) {
        best = PdChoice{p, d, dv.kv_listen};
        best_load = load;
      }
    }
  }
  if (!best && why) {
    if (!any_prefill)
      *why = "no prefill worker is up";
    else if (!any_decode)
      *why = "no decode worker is up";
    else
      *why = "no up prefill worker lists an up decode worker's KV address among its --decode-peer addresses";
  }
  return best;
}

}  // namespace kvs::router
