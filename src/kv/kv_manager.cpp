#include "kv/kv_manager.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kv/block_storage.h"
#include "kv/prefix_chain.h"

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
  fill_.assign(size_t(n_blocks), 0);
}

KvManager::Seq& KvManager::get(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::out_of_range("kv manager: unknown sequence " + std::to_string(seq));
  return it->second;
}

const KvManager::Seq& KvManager::get(SeqId seq) const { return const_cast<KvManager*>(this)->get(seq); }

int32_t KvManager::alloc_one() {
  auto b = pool_.allocate();
  if (!b) throw bug("pool ran dry after its availability was checked");
  fill_[*b] = 0;
  return *b;
}

// The prompt's chain through the prefix index until the first miss (any
// later block's key depends on the missing one, so it cannot be cached
// either): on_hit(block, key) per hit, in order. Returns the hits.
template <class OnHit>
static int64_t match_cached(const BlockPool& pool, std::span<const int32_t> prompt, int bs, const Scope& scope,
                            OnHit&& on_hit) {
  return walk_chain(prompt, bs, scope, [&](int64_t, const BlockKey& k) {
    const auto b = pool.lookup(k);
    if (!b) return false;
    on_hit(*b, k);
    return true;
  });
}

// Shares every cached block of the prompt's chain into s's table.
void KvManager::pin_cached(Seq& s, std::span<const int32_t> prompt) {
  match_cached(pool_, prompt, bs_, s.scope, [&](int32_t b, const BlockKey& k) {
    pool_.share(b);
    s.table.push_back(b);
    s.keys.push_back(k);
  });
}

SeqAdmission KvManager::add_sequence(std::span<const int32_t> prompt, const Scope& scope, BlockImporter* importer,
                                     bool use_cache) {
  owner_.check("KvManager::add_sequence");
  Seq s;
  s.scope = scope;
  const int64_t n = int64_t(prompt.size());
  int64_t ram_hits = 0;
  if (caching_ && use_cache) {
    pin_cached(s, prompt);  // each hit shared: an import below cannot evict it
    ram_hits = int64_t(s.table.size());
    if (importer && !dropped_.empty() && is_dropped(scope)) importer = nullptr;
    if (importer) import_chain(s, prompt, *importer);
  }
  int64_t cached = int64_t(s.table.size()) * bs_;
  if (cached == n && n > 0) {
    // Fully cached prompt: the last token is recomputed for its logits. The
    // sequence keeps the cached block but sees it one slot short, so the
    // next reserve() copies it (a keyed block is never written) and only one
    // token goes through the model, not a whole block as in vLLM. (With
    // block size 1 the last block would hold none of the sequence's tokens:
    // it is simply not taken.)
    // A quantized cache recomputes the whole last token group instead: its
    // rows must be in the sequence's full-precision residual.
    cached = (n - 1) / align_ * align_;
    const size_t keep = size_t(ceil_div(cached, bs_));
    for (size_t i = s.table.size(); i-- > keep;) pool_.release(s.table[i]);
    s.table.resize(keep);
    s.keys.resize(size_t(cached / bs_));
  }
  s.residual.assign(residual_floats_, 0.0f);
  s.tokens.assign(prompt.begin(), prompt.begin() + cached);
  if (caching_ && use_cache) {
    query_tokens_ += n;
    hit_tokens_ += cached;
  }
  const int imported = int(std::max<int64_t>(0, cached - ram_hits * bs_));
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::move(s));
  return {id, int(cached), imported};
}

// Continues the chain past the RAM index with blocks a lower tier has ready:
// each goes into a fresh block (written by the importer), is keyed like a
// computed block would be, and joins the table as a hit.
void KvManager::import_chain(Seq& s, std::span<const int32_t> prompt, BlockImporter& imp) {
  const int64_t from = int64_t(s.table.size());
  walk_chain(
      prompt, bs_, s.scope,
      [&](int64_t i, const BlockKey& k) {
        if (!imp.ready(k) || pool_.n_available() == 0) return false;
        const int32_t b = alloc_one();
        if (!imp.fill(k, b) || !pool_.set_key(b, k, s.scope)) {
          pool_.release(b);
          return false;
        }
        fill_[b] = bs_;
        s.table.push_back(b);
        s.keys.push_back(k);
        ++imported_;
        if (events_) note_stored(b, s.keys, i, prompt.data() + i * bs_);
        return true;
      },
      from, from ? &s.keys.back() : nullptr);
}

KvManager::Adoption KvManager::reserve_adoption(std::span<const int32_t> prompt, const Scope& scope) {
  owner_.check("KvManager::reserve_adoption");
  const int64_t n = int64_t(prompt.size());
  if (n == 0) throw std::invalid_argument("kv manager: an adopted prompt needs at least one token");
  Seq s;
  s.scope = scope;
  if (caching_) pin_cached(s, prompt);
  const int32_t hits = int32_t(s.table.size());
  const int64_t want = ceil_div(n, bs_);
  if (want - hits > pool_.n_available()) {
    for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) pool_.release(*it);
    return {};
  }
  while (int64_t(s.table.size()) < want) s.table.push_back(alloc_one());
  s.tokens.assign(prompt.begin(), prompt.begin() + int64_t(hits) * bs_);
  s.residual.assign(residual_floats_, 0.0f);
  if (caching_) {
    query_tokens_ += n;
    hit_tokens_ += int64_t(hits) * bs_;
  }
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::move(s));
  return {id, hits, int32_t(want)};
}

void KvManager::finish_adoption(SeqId seq, std::span<const int32_t> prompt) {
  const Seq& s = get(seq);
  const size_t have = s.tokens.size();
  if (have > prompt.size() || !std::equal(s.tokens.begin(), s.tokens.end(), prompt.begin()))
    throw bug("finish_adoption with a prompt other than the reserved one");
  commit(seq, prompt.subspan(have));
}

std::vector<BlockKey> KvManager::chain_keys(std::span<const int32_t> prompt, const Scope& scope,
                                            int64_t max_blocks) const {
  return kvs::chain_keys(prompt, bs_, scope, max_blocks);
}

int32_t KvManager::cached_prefix_blocks(std::span<const int32_t> prompt, const Scope& scope) const {
  return int32_t(probe_prefix(prompt, scope).hits);
}

KvManager::PrefixProbe KvManager::probe_prefix(std::span<const int32_t> tokens, const Scope& scope) const {
  PrefixProbe p;
  if (!caching_) return p;
  p.hits = match_cached(pool_, tokens, bs_, scope,
                        [&](int32_t b, const BlockKey&) { p.revived += pool_.state(b) == BlockState::Cached; });
  return p;
}

int64_t KvManager::exclusive_blocks(SeqId seq) const {
  int64_t n = 0;
  for (int32_t b : get(seq).table) n += b >= 0 && pool_.ref_count(b) == 1;
  return n;
}

int32_t KvManager::blocks_needed(SeqId seq, int n_new) const {
  const Seq& s = get(seq);
  if (n_new < 0) throw std::invalid_argument("kv manager: negative token count");
  if (n_new == 0) return 0;
  const int64_t len = int64_t(s.tokens.size());
  const int64_t want = ceil_div(len + n_new, bs_);
  int32_t need = int32_t(std::max<int64_t>(0, want - int64_t(s.table.size())));
  // Existing blocks the new tokens land in: only the first can be shared or
  // keyed (reserved blocks past it are always private), but check them all.
  for (int64_t i = len / bs_; i < std::min<int64_t>(want, int64_t(s.table.size())); ++i)
    if (must_copy(s.table[i])) ++need;
  return need;
}

int64_t KvManager::live_cap() const { return window_block_cap(window_, bs_, max_step_); }

int64_t KvManager::horizon_blocks(SeqId seq, int64_t horizon) const {
  const Seq& s = get(seq);
  const int64_t n = std::max<int64_t>(0, horizon - int64_t(s.tokens.size()));
  const int64_t need = blocks_needed(seq, int(std::min<int64_t>(n, INT32_MAX)));
  const int64_t cap = live_cap();
  if (cap == INT64_MAX) return need;
  const int64_t held = int64_t(s.table.size()) - std::count(s.table.begin(), s.table.end(), -1);
  return std::min(need, std::max<int64_t>(0, cap - held));
}

bool KvManager::reserve(SeqId seq, int n_new) {
  owner_.check("KvManager::reserve");
  const int32_t need = blocks_needed(seq, n_new);
  if (need > pool_.n_available()) return false;  // nothing changed
  if (need == 0) return true;
  Seq& s = get(seq);
  const int64_t len = int64_t(s.tokens.size());
  const int64_t want = ceil_div(len + n_new, bs_);
  for (int64_t i = len / bs_; i < std::min<int64_t>(want, int64_t(s.table.size())); ++i) {
    const int32_t old = s.table[i];
    if (!must_copy(old)) continue;
    const int32_t fresh = alloc_one();
    if (storage_) storage_->copy_block(fresh, old);
    fill_[fresh] = int32_t(std::min<int64_t>(bs_, len - i * bs_));  // this sequence's tokens in it
    s.table[i] = fresh;
    pool_.release(old);  // ref > 1 or keyed: it stays with its other holders or in the cache
    ++cow_copies_;
  }
  while (int64_t(s.table.size()) < want) s.table.push_back(alloc_one());
  return true;
}

void KvManager::unreserve(SeqId seq) {
  owner_.check("KvManager::unreserve");
  Seq& s = get(seq);
  const size_t keep = size_t(ceil_div(int64_t(s.tokens.size()), bs_));
  while (s.table.size() > keep) {
    pool_.release(s.table.back());
    s.table.pop_back();
  }
}

void KvManager::commit(SeqId seq, std::span<const int32_t> toks) {
  owner_.check("KvManager::commit");
  Seq& s = get(seq);
  const int64_t len = int64_t(s.tokens.size()), n = int64_t(toks.size());
  if (n == 0) return;
  if (len + n > int64_t(s.table.size()) * bs_)
    throw bug("commit of " + std::to_string(n) + " tokens past the reservation of sequence " + std::to_string(seq));
  for (int64_t i = len / bs_; i <= (len + n - 1) / bs_; ++i) {
    const int32_t b = s.table[i];
    if (must_copy(b)) throw bug("commit into shared or keyed block " + std::to_string(b) + " (reserve first)");
    fill_[b] = int32_t(std::min<int64_t>(bs_, len + n - i * bs_));
  }
  s.tokens.insert(s.tokens.end(), toks.begin(), toks.end());
  if (caching_) register_keys(s);
  free_dead(s);
}

void KvManager::free_dead(Seq& s) {
  if (!window_.active()) return;
  const auto [lo, hi] = window_.dead_range(int(s.tokens.size()));
  for (int64_t b = ceil_div(lo, bs_); (b + 1) * bs_ <= hi && b < int64_t(s.table.size()); ++b) {
    if (s.table[size_t(b)] < 0) continue;
    pool_.release(s.table[size_t(b)]);
    s.table[size_t(b)] = -1;
  }
}

void KvManager::register_keys(Seq& s) {
  const bool dropped = !dropped_.empty() && is_dropped(s.scope);
  const int64_t from = int64_t(s.keys.size());
  walk_chain(
      s.tokens, bs_, s.scope,
      [&](int64_t i, const BlockKey& k) {
        s.keys.push_back(k);
        // False when the same prefix was computed concurrently by another
        // sequence: that copy stays the cached one and ours is freed on
        // release. A dropped scope's blocks stay unkeyed (never cached).
        const int32_t b = s.table[size_t(i)];
        if (dropped || b < 0 || !pool_.set_key(b, k, s.scope)) return true;
        if (events_) note_stored(b, s.keys, i, s.tokens.data() + i * bs_);
        if (keyed_hook_) keyed_hook_(keyed_ctx_, b, k, s.scope);
        return true;
      },
      from, from ? &s.keys.back() : nullptr);
}

void KvManager::note_stored(int32_t block, const std::vector<BlockKey>& keys, int64_t i, const int32_t* tokens) {
  KvEvent e;
  e.kind = KvEvent::Kind::Stored;
  e.block = block;
  e.key = keys[size_t(i)];
  e.has_parent = i > 0;
  if (i > 0) e.parent = keys[size_t(i - 1)];
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
  c.table.assign(p.table.begin(), p.table.begin() + ceil_div(int64_t(p.tokens.size()), bs_));
  for (int32_t b : c.table)
    if (b >= 0) pool_.share(b);
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::move(c));
  return id;
}

void KvManager::release(SeqId seq) {
  owner_.check("KvManager::release");
  Seq& s = get(seq);
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it)
    if (*it >= 0) pool_.release(*it);
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
  for (int32_t b : s.table) {
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
    st.seq_blocks += int64_t(s.table.size() - size_t(std::count(s.table.begin(), s.table.end(), -1)));
    st.residual_bytes += int64_t(s.residual.size() * sizeof(float));
  }
  for (int32_t b = 0; b < pool_.size(); ++b)
    if (pool_.state(b) == BlockState::Used) st.stored_tokens += fill_[b];
  st.waste_slots = st.used_blocks * bs_ - st.stored_tokens;
  st.prefix_query_tokens = query_tokens_;
  st.prefix_hit_tokens = hit_tokens_;
  st.cow_copies = cow_copies_;
  st.evictions = pool_.evictions();
  st.imported_blocks = imported_;
  return st;
}

void KvManager::check_invariants(bool deep) const {
  pool_.check_invariants();
  auto fail = [](const std::string& s) { throw bug("invariant: " + s); };
  std::vector<int32_t> holders(size_t(pool_.size()), 0);
  for (const auto& [id, s] : seqs_) {
    const std::string sid = "sequence " + std::to_string(id);
    const int64_t len = int64_t(s.tokens.size());
    if (int64_t(s.table.size()) < ceil_div(len, bs_)) fail(sid + ": table shorter than its tokens");
    if (int64_t(s.keys.size()) != (caching_ ? len / bs_ : 0))
      fail(sid + ": key chain length is not the number of full blocks");
    for (size_t i = 0; i < s.table.size(); ++i) {
      const int32_t b = s.table[i];
      if (b < 0 && window_.active()) {
        // Freed by the window: only blocks no later token can see.
        const auto [lo, hi] = window_.dead_range(int(len));
        if (int64_t(i) * bs_ < lo || (int64_t(i) + 1) * bs_ > hi) fail(sid + ": a visible block was freed");
        continue;
      }
      if (b < 0 || b >= pool_.size()) fail(sid + ": bad block id");
      ++holders[b];
      if (pool_.state(b) != BlockState::Used) fail(sid + " holds block " + std::to_string(b) + " that is not used");
      const int64_t in_block = std::clamp<int64_t>(len - int64_t(i) * bs_, 0, bs_);
      if (fill_[b] < in_block) fail(sid + ": block " + std::to_string(b) + " holds fewer tokens than the sequence has");
      if (int64_t(i) < len / bs_) {
        if (pool_.has_key(b) && pool_.key(b) != s.keys[i])
          fail(sid + ": block " + std::to_string(b) + " is keyed for another prefix");
      } else if (int64_t(i) > len / bs_ || (len % bs_ == 0)) {
        // Reserved-only blocks (no token of this sequence yet) are private.
        if (pool_.ref_count(b) != 1 || pool_.has_key(b))
          fail(sid + ": reserved block " + std::to_string(b) + " is shared or keyed");
      }
    }
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
