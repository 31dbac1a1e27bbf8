#include "kv/pool_snapshot.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

namespace kvs {

uint32_t owner_tag(const Scope& scope) {
  uint32_t t;
  std::memcpy(&t, scope.bytes.data(), sizeof t);
  return t == 0 ? 1u : t;
}

namespace {

// Per block: state, ref count and owner tag, read in bulk. Free and cached
// blocks come from the pool's own lists; every other block is used, its ref
// count is the number of tables naming it (a pool invariant) and its owner
// the scope of a sequence holding it (blocks are shared only within one
// scope). Only cached blocks ask the pool for their scope one by one.
struct BlockFacts {
  std::vector<BlockState> state;
  std::vector<int32_t> ref;
  std::vector<uint32_t> tag;
};

// Filled into the calling thread's buffers: a fresh allocation of this size
// per snapshot costs more in page faults than the reading itself.
const BlockFacts& block_facts(const KvManager& kv) {
  const BlockPool& p = kv.pool();
  const size_t n = size_t(p.size());
  thread_local BlockFacts f;
  f.state.assign(n, BlockState::Used);
  f.ref.assign(n, 0);
  f.tag.assign(n, 0);
  for (int32_t b : p.free_order()) f.state[size_t(b)] = BlockState::Free;
  for (int32_t b : p.lru_order()) {
    f.state[size_t(b)] = BlockState::Cached;
    f.tag[size_t(b)] = owner_tag(p.scope_of(b));
  }
  for (SeqId s : kv.sequences()) {
    const uint32_t t = owner_tag(kv.scope(s));
    for (int32_t b : kv.block_table(s))
      if (b >= 0) {
        ++f.ref[size_t(b)];
        f.tag[size_t(b)] = t;
      }
  }
  return f;
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
  const BlockFacts& f = block_facts(kv);
  OwnerIndex index(out);
  for (int32_t c = 0; c < cells; ++c) {
    const int32_t lo = c * out.group, hi = std::min(out.total, lo + out.group);
    // Majority vote over the cell's non-free blocks (one pass, no counts).
    int32_t cand = -1, votes = 0;
    for (int32_t b = lo; b < hi; ++b) {
      const BlockState st = f.state[size_t(b)];
      if (st == BlockState::Free) {
        ++out.n_free[size_t(c)];
        continue;
      }
      const int32_t o = index(f.tag[size_t(b)]);
      if (st == BlockState::Cached) {
        ++out.n_cached[size_t(c)];
        ++out.owner_cached[size_t(o)];
      } else {
        const int32_t r = f.ref[size_t(b)];
        ++out.n_used[size_t(c)];
        ++out.owner_used[size_t(o)];
        out.n_shared[size_t(c)] += r > 1;
        out.max_ref[size_t(c)] = std::max(out.max_ref[size_t(c)], r);
      }
      if (votes == 0) cand = o;
      votes += cand == o ? 1 : -1;
    }
    out.owner[size_t(c)] = cand;
  }
  return out;
}

}  // namespace kvs
