#include "kv/pool_snapshot.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace kvs {

uint32_t owner_tag(const Scope& scope) { return scope_tag(scope); }

namespace {

// The owner tag of every block in a table (blocks are shared only within
// one scope, so any table names the owner), 0 elsewhere. Filled into the
// calling thread's buffer: a fresh allocation of this size per snapshot
// costs more in page faults than the reading itself.
const std::vector<uint32_t>& table_tags(const KvManager& kv) {
  thread_local std::vector<uint32_t> tag;
  tag.assign(size_t(kv.pool().size()), 0);
  for (SeqId s : kv.sequences()) {
    const uint32_t t = owner_tag(kv.scope(s));
    for (const std::vector<int32_t>& table : kv.block_tables(s))
      for (int32_t b : table)
        if (b >= 0) tag[size_t(b)] = t;
  }
  return tag;
}

// Index of `tag` in out.owners, added on first sight. Neighbouring blocks
// mostly share an owner, so the last answer is tried first.
class OwnerIndex {
 public:
  explicit OwnerIndex(PoolCells& out) : out_(out) {}
  int32_t operator()(uint32_t tag) {
    if (tag == last_tag_) return last_;
    auto [it, added] = map_.try_emplace(tag, int32_t(out_.owners.size()));
    if (added) {
      out_.owners.push_back(tag);
      out_.owner_used.push_back(0);
      out_.owner_cached.push_back(0);
    }
    last_tag_ = tag;
    return last_ = it->second;
  }

 private:
  PoolCells& out_;
  std::unordered_map<uint32_t, int32_t> map_;
  uint32_t last_tag_ = 0;
  int32_t last_ = -1;
};

}  // namespace

PoolCells snapshot_pool(const KvManager& kv, int32_t max_cells) {
  if (max_cells < 1) throw std::invalid_argument("snapshot_pool: max_cells must be >= 1");
  const BlockPool& p = kv.pool();
  PoolCells out;
  out.total = p.size();
  out.free = p.n_free();
  out.cached = p.n_cached();
  out.used = p.n_used();
  out.group = (out.total + max_cells - 1) / max_cells;
  const int32_t cells = (out.total + out.group - 1) / out.group;
  for (auto* v : {&out.n_free, &out.n_cached, &out.n_used, &out.n_shared, &out.max_ref}) v->assign(size_t(cells), 0);
  out.owner.assign(size_t(cells), -1);
  out.n_tables = kv.n_tables();
  out.table.assign(size_t(cells), -1);
  out.table_used.assign(size_t(out.n_tables), 0);
  const BlockState* state = p.states();
  const int32_t* ref = p.refs();
  const uint32_t* cached_tag = p.scope_tags();
  const uint32_t* tag = table_tags(kv).data();
  OwnerIndex index(out);
  // Per-owner counts of the current run of one owner, added when it ends:
  // neighbouring blocks mostly share an owner.
  int32_t run_owner = -1, run_used = 0, run_cached = 0;
  auto end_run = [&] {
    if (run_owner < 0) return;
    out.owner_used[size_t(run_owner)] += run_used;
    out.owner_cached[size_t(run_owner)] += run_cached;
    run_used = run_cached = 0;
  };
  for (int32_t c = 0; c < cells; ++c) {
    const int32_t lo = c * out.group, hi = std::min(out.total, lo + out.group);
    int32_t n_free = 0, n_cached = 0, n_used = 0, n_shared = 0, max_ref = 0;
    // Majority votes over the cell's non-free blocks (one pass, no counts):
    // its owner and its table.
    int32_t cand = -1, votes = 0, tcand = -1, tvotes = 0;
    for (int32_t b = lo; b < hi; ++b) {
      const BlockState st = state[b];
      if (st == BlockState::Free) {
        ++n_free;
        continue;
      }
      const bool cached = st == BlockState::Cached;
      const int32_t o = index(cached ? cached_tag[b] : tag[b]);
      if (o != run_owner) {
        end_run();
        run_owner = o;
      }
      if (cached) {
        ++n_cached;
        ++run_cached;
      } else {
        const int32_t r = ref[b];
        ++n_used;
        ++run_used;
        n_shared += r > 1;
        max_ref = std::max(max_ref, r);
      }
      if (votes == 0) cand = o;
      votes += cand == o ? 1 : -1;
      const int32_t t = std::max(0, kv.table_of_block(b));
      if (!cached) ++out.table_used[size_t(t)];
      if (tvotes == 0) tcand = t;
      tvotes += tcand == t ? 1 : -1;
    }
    out.n_free[size_t(c)] = n_free;
    out.n_cached[size_t(c)] = n_cached;
    out.n_used[size_t(c)] = n_used;
    out.n_shared[size_t(c)] = n_shared;
    out.max_ref[size_t(c)] = max_ref;
    out.owner[size_t(c)] = cand;
    out.table[size_t(c)] = tcand;
  }
  end_run();
  return out;
}

}  // namespace kvs
