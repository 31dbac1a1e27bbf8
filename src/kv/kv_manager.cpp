#include "kv/kv_manager.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kv/block_storage.h"
#include "kv/prefix_chain.h"
#include "kv/prefix_hits.h"

namespace kvs {

static std::logic_error bug(const std::string& what) { return std::logic_error("kv manager: " + what); }

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

KvManager::KvManager(int32_t n_blocks, const KvManagerOptions& opts, BlockStorage* storage)
    : bs_(opts.block_size),
      caching_(opts.prefix_caching),
      align_(opts.align_tokens),
      residual_floats_(opts.residual_floats),
      window_(opts.window),
      max_step_(std::max(1, opts.max_step_tokens)),
      pool_(n_blocks),
      storage_(storage) {
  if (bs_ < 1) throw std::invalid_argument("kv manager: block size must be >= 1, got " + std::to_string(bs_));
  window_.validate();
  if (align_ < 1 || bs_ % align_ != 0)
    throw std::invalid_argument("kv manager: alignment " + std::to_string(align_) + " must divide the block size");
  if (storage_ && (storage_->n_blocks() != n_blocks || storage_->view().layout.block_size != bs_))
    throw std::invalid_argument("kv manager: storage has " + std::to_string(storage_->n_blocks()) + " blocks of " +
                                std::to_string(storage_->view().layout.block_size) + " slots, pool wants " +
                                std::to_string(n_blocks) + " of " + std::to_string(bs_));
  const std::vector<int> windows = opts.table_windows.empty() ? std::vector<int>{0} : opts.table_windows;
  if (windows.size() > 64) throw std::invalid_argument("kv manager: more than 64 KV tables");
  if (storage_ && storage_->view().layout.n_tables() != int(windows.size()))
    throw std::invalid_argument("kv manager: the storage layout has " +
                                std::to_string(storage_->view().layout.n_tables()) + " KV tables, the options " +
                                std::to_string(windows.size()));
  for (int w : windows) {
    if (w < 0) throw std::invalid_argument("kv manager: a table's window must be >= 0 tokens");
    tw_.push_back({window_, w});
    caps_.push_back(tw_.back().block_cap(bs_, max_step_));
  }
  fill_.assign(size_t(n_blocks), 0);
  block_table_.assign(size_t(n_blocks), -1);
}

KvManager::Seq& KvManager::get(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::out_of_range("kv manager: unknown sequence " + std::to_string(seq));
  return it->second;
}

const KvManager::Seq& KvManager::get(SeqId seq) const { return const_cast<KvManager*>(this)->get(seq); }

int32_t KvManager::alloc_one(int table) {
  auto b = pool_.allocate();
  if (!b) throw bug("pool ran dry after its availability was checked");
  fill_[*b] = 0;
  block_table_[*b] = int8_t(table);
  return *b;
}

int64_t KvManager::held(const Seq& s, size_t t) const {
  return int64_t(s.tables[t].size()) - std::count(s.tables[t].begin(), s.tables[t].end(), -1);
}

int64_t KvManager::exclusive_blocks(SeqId seq) const {
  int64_t n = 0;
  for (const std::vector<int32_t>& tb : get(seq).tables)
    for (int32_t b : tb) n += b >= 0 && pool_.ref_count(b) == 1;
  return n;
}

int32_t KvManager::blocks_needed(SeqId seq, int n_new) const {
  const Seq& s = get(seq);
  if (n_new < 0) throw std::invalid_argument("kv manager: negative token count");
  if (n_new == 0) return 0;
  const int64_t len = int64_t(s.tokens.size());
  const int64_t want = ceil_div(len + n_new, bs_);
  int32_t need = 0;
  for (const std::vector<int32_t>& tb : s.tables) {
    need += int32_t(std::max<int64_t>(0, want - int64_t(tb.size())));
    // Existing blocks the new tokens land in: only the first can be shared
    // or keyed (reserved blocks past it are always private), but check them all.
    for (int64_t i = len / bs_; i < std::min<int64_t>(want, int64_t(tb.size())); ++i)
      if (tb[size_t(i)] >= 0 && must_copy(tb[size_t(i)])) ++need;
  }
  return need;
}

int64_t KvManager::live_cap() const {
  int64_t sum = 0;
  for (int64_t c : caps_) {
    if (c == INT64_MAX) return INT64_MAX;
    sum += c;
  }
  return sum;
}

int64_t KvManager::bounded(int64_t blocks, int64_t mult) const {
  int64_t sum = 0;
  for (int64_t c : caps_) sum += c == INT64_MAX ? blocks : std::min(blocks, c * mult);
  return sum;
}

int64_t KvManager::horizon_blocks(SeqId seq, int64_t horizon) const {
  const Seq& s = get(seq);
  const int64_t len = int64_t(s.tokens.size());
  const int64_t n = std::max<int64_t>(0, horizon - len);
  if (n == 0) return 0;
  const int64_t want = ceil_div(len + std::min<int64_t>(n, INT32_MAX), bs_);
  int64_t sum = 0;
  for (size_t t = 0; t < s.tables.size(); ++t) {
    const std::vector<int32_t>& tb = s.tables[t];
    int64_t need = std::max<int64_t>(0, want - int64_t(tb.size()));
    for (int64_t i = len / bs_; i < std::min<int64_t>(want, int64_t(tb.size())); ++i)
      if (tb[size_t(i)] >= 0 && must_copy(tb[size_t(i)])) ++need;
    sum += caps_[t] == INT64_MAX ? need : std::min(need, std::max<int64_t>(0, caps_[t] - held(s, t)));
  }
  return sum;
}

bool KvManager::reserve(SeqId seq, int n_new) {
  owner_.check("KvManager::reserve");
  const int32_t need = blocks_needed(seq, n_new);
  if (need > pool_.n_available()) return false;  // nothing changed
  if (need == 0) return true;
  Seq& s = get(seq);
  const int64_t len = int64_t(s.tokens.size());
  const int64_t want = ceil_div(len + n_new, bs_);
  for (size_t t = 0; t < s.tables.size(); ++t) {
    std::vector<int32_t>& tb = s.tables[t];
    for (int64_t i = len / bs_; i < std::min<int64_t>(want, int64_t(tb.size())); ++i) {
      const int32_t old = tb[size_t(i)];
      if (old < 0) throw bug("a block the next tokens land in was freed by the window");
      if (!must_copy(old)) continue;
      const int32_t fresh = alloc_one(int(t));
      if (storage_) storage_->copy_block(fresh, old);
      fill_[fresh] = int32_t(std::min<int64_t>(bs_, len - i * bs_));  // this sequence's tokens in it
      tb[size_t(i)] = fresh;
      pool_.release(old);  // ref > 1 or keyed: it stays with its other holders or in the cache
      ++cow_copies_;
    }
    while (int64_t(tb.size()) < want) tb.push_back(alloc_one(int(t)));
  }
  return true;
}

void KvManager::unreserve(SeqId seq) {
  owner_.check("KvManager::unreserve");
  Seq& s = get(seq);
  const size_t keep = size_t(ceil_div(int64_t(s.tokens.size()), bs_));
  for (std::vector<int32_t>& tb : s.tables)
    for (; tb.size() > keep; tb.pop_back())
      if (tb.back() >= 0) pool_.release(tb.back());
}

void KvManager::commit(SeqId seq, std::span<const int32_t> toks) {
  owner_.check("KvManager::commit");
  Seq& s = get(seq);
  const int64_t len = int64_t(s.tokens.size()), n = int64_t(toks.size());
  if (n == 0) return;
  for (size_t t = 0; t < s.tables.size(); ++t) {
    const std::vector<int32_t>& tb = s.tables[t];
    if (len + n > int64_t(tb.size()) * bs_)
      throw bug("commit of " + std::to_string(n) + " tokens past the reservation of sequence " + std::to_string(seq));
    for (int64_t i = len / bs_; i <= (len + n - 1) / bs_; ++i) {
      const int32_t b = tb[size_t(i)];
      if (b < 0) {
        // An adoption's windowed table lays out only what the next query sees.
        if (!tw_[t].frees() || !tw_[t].dead(i * bs_, (i + 1) * bs_, int(len + n)))
          throw bug("commit into a block the window freed");
        continue;
      }
      if (must_copy(b)) throw bug("commit into shared or keyed block " + std::to_string(b) + " (reserve first)");
      fill_[b] = int32_t(std::min<int64_t>(bs_, len + n - i * bs_));
    }
  }
  s.tokens.insert(s.tokens.end(), toks.begin(), toks.end());
  if (caching_) register_keys(s);
  free_dead(s);
}

void KvManager::free_dead(Seq& s) {
  const int p = int(s.tokens.size());
  for (size_t t = 0; t < tw_.size(); ++t) {
    const TableWindow& w = tw_[t];
    if (!w.frees()) continue;
    std::vector<int32_t>& tb = s.tables[t];
    const int64_t size = int64_t(tb.size());
    auto drop = [&](int64_t b) {
      if (tb[size_t(b)] < 0) return false;
      pool_.release(tb[size_t(b)]);
      tb[size_t(b)] = -1;
      return true;
    };
    if (w.policy.active()) {
      const auto [lo, hi] = w.policy.dead_range(p);
      for (int64_t b = ceil_div(lo, bs_); (b + 1) * bs_ <= hi && b < size; ++b) drop(b);
    }
    // The layer window hides [0, p - W + 1): its whole blocks, newest first
    // (a released chain's tail goes to the LRU before its head). A native
    // policy at most that long has freed them already.
    const bool covered = w.policy.kind == WindowKind::Native && w.policy.window <= w.layer_window;
    if (w.layer_window <= 0 || covered) continue;
    const int64_t m = std::max<int64_t>(0, int64_t(p) - w.layer_window + 1);
    for (int64_t b = std::min(m / bs_, size) - 1; b >= 0; --b)
      if (!drop(b) && !w.policy.active()) break;  // everything below went at an earlier commit
  }
}

void KvManager::register_keys(Seq& s) {
  const bool dropped = !dropped_.empty() && is_dropped(s.scope);
  const int64_t from = int64_t(s.keys.size());
  walk_chain(
      s.tokens, bs_, s.scope,
      [&](int64_t i, const BlockKey& k) {
        s.keys.push_back(k);
        // A dropped scope's blocks stay unkeyed (never cached).
        if (dropped) return true;
        for (size_t t = 0; t < s.tables.size(); ++t) {
          const int32_t b = s.tables[t][size_t(i)];
          if (b >= 0) key_block(b, s.keys, i, int(t), s.scope, s.tokens.data() + i * bs_, true);
        }
        return true;
      },
      from, from ? &s.keys.back() : nullptr);
}

bool KvManager::key_block(int32_t b, const std::vector<BlockKey>& keys, int64_t i, int t, const Scope& scope,
                          const int32_t* tokens, bool hook) {
  // False when the same prefix was computed concurrently by another
  // sequence: that copy stays the cached one and ours is freed on release.
  const BlockKey key = table_key(keys[size_t(i)], t);
  if (!pool_.set_key(b, key, scope)) return false;
  if (events_) note_stored(b, keys, i, t, tokens);
  if (hook && keyed_hook_) {
    const BlockKey parent = i > 0 ? table_key(keys[size_t(i - 1)], t) : BlockKey{};
    keyed_hook_(keyed_ctx_, b, key, i > 0 ? &parent : nullptr, scope);
  }
  return true;
}

void KvManager::note_stored(int32_t block, const std::vector<BlockKey>& keys, int64_t i, int t, const int32_t* tokens) {
  KvEvent e;
  e.kind = KvEvent::Kind::Stored;
  e.block = block;
  e.table = t;
  e.key = table_key(keys[size_t(i)], t);
  e.has_parent = i > 0;
  if (i > 0) e.parent = table_key(keys[size_t(i - 1)], t);
  if (events_->tokens) e.tokens.assign(tokens, tokens + bs_);
  events_->events.push_back(std::move(e));
}

SeqId KvManager::fork(SeqId parent) {
  owner_.check("KvManager::fork");
  const Seq& p = get(parent);
  Seq c;
  c.tokens = p.tokens;
  c.keys = p.keys;
  c.scope = p.scope;
  c.residual = p.residual;  // the open group's rows: each sequence writes its own
  // Only blocks holding tokens: the parent's reservation stays its own.
  const int64_t n = ceil_div(int64_t(p.tokens.size()), bs_);
  for (const std::vector<int32_t>& tb : p.tables) {
    c.tables.emplace_back(tb.begin(), tb.begin() + n);
    for (int32_t b : c.tables.back())
      if (b >= 0) pool_.share(b);
  }
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::move(c));
  return id;
}

void KvManager::release(SeqId seq) {
  owner_.check("KvManager::release");
  Seq& s = get(seq);
  size_t len = 0;
  for (const std::vector<int32_t>& tb : s.tables) len = std::max(len, tb.size());
  for (size_t i = len; i-- > 0;)  // tail first, every table
    for (const std::vector<int32_t>& tb : s.tables)
      if (i < tb.size() && tb[i] >= 0) pool_.release(tb[i]);
  const Scope scope = s.scope;
  seqs_.erase(seq);
  if (!dropped_.empty() && is_dropped(scope)) {
    bool live = false;
    for (const auto& [id, o] : seqs_) live = live || o.scope == scope;
    if (!live) std::erase(dropped_, scope);
  }
}

bool KvManager::is_dropped(const Scope& scope) const {
  return std::find(dropped_.begin(), dropped_.end(), scope) != dropped_.end();
}

int32_t KvManager::drop_cached_scope(const Scope& scope) {
  owner_.check("KvManager::drop_cached_scope");
  bool live = false;
  for (const auto& [id, s] : seqs_) live = live || s.scope == scope;
  if (live && !is_dropped(scope)) dropped_.push_back(scope);
  return pool_.drop_scope(scope);
}

SeqInfo KvManager::seq_info(SeqId seq) const {
  const Seq& s = get(seq);
  SeqInfo i;
  i.tokens = int(s.tokens.size());
  for (const std::vector<int32_t>& tb : s.tables)
    for (int32_t b : tb) {
      if (b < 0) continue;
      ++i.blocks;
      i.shared_blocks += pool_.ref_count(b) > 1;
    }
  return i;
}

std::vector<SeqId> KvManager::sequences() const {
  std::vector<SeqId> ids;
  ids.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

KvStats KvManager::stats() const {
  KvStats st;
  st.block_size = bs_;
  st.total_blocks = pool_.size();
  st.free_blocks = pool_.n_free();
  st.cached_blocks = pool_.n_cached();
  st.used_blocks = pool_.n_used();
  st.sequences = int64_t(seqs_.size());
  for (const auto& [id, s] : seqs_) {
    st.seq_tokens += int64_t(s.tokens.size());
    for (size_t t = 0; t < s.tables.size(); ++t) st.seq_blocks += held(s, t);
    st.residual_bytes += int64_t(s.residual.size() * sizeof(float));
  }
  st.table_blocks.assign(tw_.size(), 0);
  for (int32_t b = 0; b < pool_.size(); ++b)
    if (pool_.state(b) == BlockState::Used) {
      st.stored_tokens += fill_[b];
      ++st.table_blocks[size_t(std::max<int8_t>(0, block_table_[b]))];
    }
  st.waste_slots = st.used_blocks * bs_ - st.stored_tokens;
  st.prefix_query_tokens = query_tokens_;
  st.prefix_hit_tokens = hit_tokens_;
  st.cow_copies = cow_copies_;
  st.evictions = pool_.evictions();
  st.imported_blocks = imported_;
  return st;
}

// One table of one sequence: every entry is a used block holding the
// sequence's tokens, or -1 only where that table's window hides it.
void KvManager::check_table(const Seq& s, size_t t, const std::string& sid, std::vector<int32_t>& holders) const {
  auto fail = [](const std::string& m) { throw bug("invariant: " + m); };
  const std::vector<int32_t>& tb = s.tables[t];
  const int64_t len = int64_t(s.tokens.size());
  const int p = int(std::max(len, s.adopt_to));
  if (int64_t(tb.size()) < ceil_div(len, bs_)) fail(sid + ": table shorter than its tokens");
  for (size_t i = 0; i < tb.size(); ++i) {
    const int32_t b = tb[i];
    if (b < 0 && tw_[t].frees()) {
      // Freed by the window: only blocks no later token can see.
      if (!tw_[t].dead(int64_t(i) * bs_, (int64_t(i) + 1) * bs_, p)) fail(sid + ": a visible block was freed");
      continue;
    }
    if (b < 0 || b >= pool_.size()) fail(sid + ": bad block id");
    ++holders[b];
    if (pool_.state(b) != BlockState::Used) fail(sid + " holds block " + std::to_string(b) + " that is not used");
    if (block_table_[b] != int8_t(t)) fail(sid + ": block " + std::to_string(b) + " was taken for another table");
    const int64_t in_block = std::clamp<int64_t>(len - int64_t(i) * bs_, 0, bs_);
    if (fill_[b] < in_block) fail(sid + ": block " + std::to_string(b) + " holds fewer tokens than the sequence has");
    if (int64_t(i) < len / bs_) {
      if (pool_.has_key(b) && pool_.key(b) != table_key(s.keys[i], int(t)))
        fail(sid + ": block " + std::to_string(b) + " is keyed for another prefix");
    } else if (int64_t(i) > len / bs_ || (len % bs_ == 0)) {
      // Reserved-only blocks (no token of this sequence yet) are private.
      if (pool_.ref_count(b) != 1 || pool_.has_key(b))
        fail(sid + ": reserved block " + std::to_string(b) + " is shared or keyed");
    }
  }
}

void KvManager::check_invariants(bool deep) const {
  pool_.check_invariants();
  auto fail = [](const std::string& s) { throw bug("invariant: " + s); };
  std::vector<int32_t> holders(size_t(pool_.size()), 0);
  for (const auto& [id, s] : seqs_) {
    const std::string sid = "sequence " + std::to_string(id);
    const int64_t len = int64_t(s.tokens.size());
    if (s.tables.size() != tw_.size()) fail(sid + ": not one block table per KV table");
    for (size_t t = 1; t < s.tables.size(); ++t)
      if (s.tables[t].size() != s.tables[0].size()) fail(sid + ": its block tables differ in length");
    if (int64_t(s.keys.size()) != (caching_ ? len / bs_ : 0))
      fail(sid + ": key chain length is not the number of full blocks");
    for (size_t t = 0; t < s.tables.size(); ++t) check_table(s, t, sid, holders);
    if (deep && caching_) {
      for (size_t i = 0; i < s.keys.size(); ++i)
        if (block_key(i ? &s.keys[i - 1] : nullptr, s.tokens.data() + i * bs_, bs_, s.scope) != s.keys[i])
          fail(sid + ": key " + std::to_string(i) + " does not match its tokens");
    }
  }
  for (int32_t b = 0; b < pool_.size(); ++b)
    if (pool_.ref_count(b) != holders[b])
      fail("block " + std::to_string(b) + " has ref count " + std::to_string(pool_.ref_count(b)) + " but " +
           std::to_string(holders[b]) + " tables hold it");
}

}  // namespace kvs
