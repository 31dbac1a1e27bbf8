#include "router/pd_choice.h"

#include <algorithm>

namespace kvs::router {

namespace {

// Which of prefill worker pv's --decode-peer entries reaches decode worker
// dv: the same string, or one that resolves to an address dv's KV address
// resolves to; -1: none.
int peer_entry(const WorkerView& pv, const WorkerView& dv) {
  for (size_t k = 0; k < pv.decode_peers.size(); ++k) {
    if (pv.decode_peers[k] == dv.kv_listen) return int(k);
    if (k >= pv.decode_peer_addrs.size()) continue;
    for (const std::string& a : pv.decode_peer_addrs[k])
      if (std::find(dv.kv_listen_addrs.begin(), dv.kv_listen_addrs.end(), a) != dv.kv_listen_addrs.end()) return int(k);
  }
  return -1;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

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
      const int k = peer_entry(pv, dv);
      if (k < 0) continue;
      const double load = pv.load + dv.load;
      if (!best || load < best_load) {
        // The prefill worker's own spelling: it checks kv_decode_peer against its list.
        best = PdChoice{p, d, pv.decode_peers[size_t(k)]};
        best_load = load;
      }
    }
  }
  if (!best && why) {
    if (!any_prefill)
      *why = "no prefill worker is up";
    else if (!any_decode)
      *why = "no decode worker is up";
    else {
      std::vector<std::string> peers, kv;
      for (const int p : prefill)
        if (view[size_t(p)].up) peers.insert(peers.end(), view[size_t(p)].decode_peers.begin(), view[size_t(p)].decode_peers.end());
      for (const int d : decode)
        if (view[size_t(d)].up && !view[size_t(d)].kv_listen.empty()) kv.push_back(view[size_t(d)].kv_listen);
      *why = "no up prefill worker lists an up decode worker's KV address among its --decode-peer addresses "
             "(--decode-peer: " + join(peers) + "; decode workers' --kv-listen: " + join(kv) +
             "): give the prefill workers --decode-peer HOST:PORT that reach a decode worker's --kv-listen";
    }
  }
  return best;
}

}  // namespace kvs::router
