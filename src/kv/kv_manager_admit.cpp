// KvManager: a prompt's way in. Prefix hits valid in every KV table (pinned
// from the RAM index, continued with a lower tier's staged blocks), the
// disaggregated decode side's adoption, and the side-effect-free probes the
// scheduler and other threads use.
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kv/kv_manager.h"
#include "kv/prefix_chain.h"
#include "kv/prefix_hits.h"

namespace kvs {

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static std::logic_error bug(const std::string& what) { return std::logic_error("kv manager: " + what); }

// What each table could take from the cache for a prompt's full blocks.
struct KvManager::HitWalk {
  std::vector<BlockKey> keys;                // [m] chain keys of the blocks walked
  std::vector<std::vector<BlockKey>> tkeys;  // [n_tables][m] each table's index key (table 0: the chain key)
  std::vector<std::vector<uint8_t>> avail;   // [n_tables][m] in the RAM index or staged by the importer
};

// Walks the chain until a table that frees nothing misses a block (no later
// block can then be a hit); with no such table, the whole prompt.
KvManager::HitWalk KvManager::walk_hits(std::span<const int32_t> prompt, const Scope& scope,
                                        BlockImporter* importer) const {
  const size_t T = tw_.size();
  HitWalk w;
  w.tkeys.resize(T);
  w.avail.resize(T);
  std::vector<BlockKey> tk(T);
  std::vector<uint8_t> av(T);
  walk_chain(prompt, bs_, scope, [&](int64_t, const BlockKey& k) {
    for (size_t t = 0; t < T; ++t) {
      tk[t] = table_key(k, int(t));
      av[t] = pool_.lookup(tk[t]).has_value() || (importer && importer->ready(tk[t]));
      if (!av[t] && !tw_[t].frees()) return false;
    }
    w.keys.push_back(k);
    for (size_t t = 0; t < T; ++t) {
      w.tkeys[t].push_back(tk[t]);
      w.avail[t].push_back(av[t]);
    }
    return true;
  });
  return w;
}

int64_t KvManager::hit_of(const HitWalk& w, int64_t n) const { return largest_hit(tw_, w.avail, n, bs_, align_); }

bool KvManager::hit_holds(size_t t, int64_t i, int64_t h, int64_t n) const {
  if (!tw_[t].frees()) return i < h;  // trimmed to the cached tokens afterwards, as with one table
  return hit_needs_block(tw_[t], i, cached_tokens_for_hit(h, n, bs_, align_), bs_);
}

int64_t KvManager::materialize(Seq& s, const HitWalk& w, int64_t h, int64_t n, BlockImporter* importer,
                               int* failed_table, int64_t* first_import) {
  const int64_t keep = ceil_div(cached_tokens_for_hit(h, n, bs_, align_), bs_);
  for (size_t t = 0; t < tw_.size(); ++t) {
    std::vector<int32_t>& tb = s.tables[t];
    const int64_t span = tw_[t].frees() ? keep : h;
    if (int64_t(tb.size()) < span) tb.resize(size_t(span), -1);
    for (int64_t i = int64_t(tb.size()) - 1; i >= 0; --i)  // a retry: what the smaller hit does not need
      if (tb[size_t(i)] >= 0 && !(i < span && hit_holds(t, i, h, n))) {
        pool_.release(tb[size_t(i)]);
        tb[size_t(i)] = -1;
      }
    tb.resize(size_t(span));
    // RAM hits first, each shared at once: an import below cannot evict it.
    for (int64_t i = 0; i < span; ++i)
      if (tb[size_t(i)] < 0 && hit_holds(t, i, h, n))
        if (const auto b = pool_.lookup(w.tkeys[t][size_t(i)])) {
          pool_.share(*b);
          tb[size_t(i)] = *b;
        }
  }
  // The rest from the importer, block by block: each into a fresh block,
  // keyed as a computed block would be.
  for (int64_t i = 0; i < h; ++i)
    for (size_t t = 0; t < tw_.size(); ++t) {
      std::vector<int32_t>& tb = s.tables[t];
      if (i >= int64_t(tb.size()) || tb[size_t(i)] >= 0 || !hit_holds(t, i, h, n)) continue;
      const BlockKey& key = w.tkeys[t][size_t(i)];
      *failed_table = int(t);
      if (!importer || pool_.n_available() == 0 || !importer->ready(key)) return i;
      const int32_t b = alloc_one(int(t));
      if (!importer->fill(key, b) || !pool_.set_key(b, key, s.scope)) {
        pool_.release(b);
        return i;
      }
      fill_[size_t(b)] = bs_;
      tb[size_t(i)] = b;
      ++imported_;
      *first_import = std::min(*first_import, i);
      if (events_) note_stored(b, w.keys, i, int(t), s.tokens.data() + i * bs_);
    }
  return -1;
}

std::pair<int64_t, int64_t> KvManager::admit_cached(Seq& s, std::span<const int32_t> prompt, BlockImporter* importer) {
  const int64_t n = int64_t(prompt.size());
  HitWalk w = walk_hits(prompt, s.scope, importer);
  s.tokens.assign(prompt.begin(), prompt.begin() + int64_t(w.keys.size()) * bs_);  // the imports' event tokens
  int64_t h = 0, first_import = INT64_MAX;
  for (;;) {
    h = hit_of(w, n);
    int ft = 0;
    const int64_t failed = materialize(s, w, h, n, importer, &ft, &first_import);
    if (failed < 0) break;
    w.avail[size_t(ft)][size_t(failed)] = 0;  // that block is not to be had: a smaller hit
  }
  // A fully cached prompt recomputes its last token (cached_tokens_for_hit):
  // the sequence keeps the block holding it but sees it one slot short, so
  // the next reserve() copies it (a keyed block is never written) and only
  // one token goes through the model, not a whole block as in vLLM. (With
  // block size 1 that block would hold none of its tokens: it is not kept.)
  // A quantized cache recomputes its whole last token group instead: its
  // rows must be in the sequence's full-precision residual.
  const int64_t cached = cached_tokens_for_hit(h, n, bs_, align_);
  const size_t keep = size_t(ceil_div(cached, bs_));
  for (size_t t = 0; t < tw_.size(); ++t)
    for (std::vector<int32_t>& tb = s.tables[t]; tb.size() > keep; tb.pop_back())
      if (tb.back() >= 0) pool_.release(tb.back());
  s.keys.assign(w.keys.begin(), w.keys.begin() + cached / bs_);
  const int64_t imported = first_import < h ? std::max<int64_t>(0, cached - first_import * bs_) : 0;
  return {cached, imported};
}

SeqAdmission KvManager::add_sequence(std::span<const int32_t> prompt, const Scope& scope, BlockImporter* importer,
                                     bool use_cache) {
  owner_.check("KvManager::add_sequence");
  Seq s;
  s.scope = scope;
  s.tables.resize(tw_.size());
  const int64_t n = int64_t(prompt.size());
  int64_t cached = 0, imported = 0;
  if (caching_ && use_cache) {
    if (importer && !dropped_.empty() && is_dropped(scope)) importer = nullptr;
    std::tie(cached, imported) = admit_cached(s, prompt, importer);
    query_tokens_ += n;
    hit_tokens_ += cached;
  }
  s.residual.assign(residual_floats_, 0.0f);
  s.tokens.assign(prompt.begin(), prompt.begin() + cached);
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::move(s));
  return {id, int(cached), int(imported)};
}

KvManager::Adoption KvManager::reserve_adoption(std::span<const int32_t> prompt, const Scope& scope) {
  owner_.check("KvManager::reserve_adoption");
  const int64_t n = int64_t(prompt.size());
  if (n == 0) throw std::invalid_argument("kv manager: an adopted prompt needs at least one token");
  const int64_t want = ceil_div(n, bs_);
  // Each table needs the blocks the first decoded token (text index n) sees.
  auto needs = [&](size_t t, int64_t i) { return !tw_[t].frees() || hit_needs_block(tw_[t], i, n, bs_); };
  Seq s;
  s.scope = scope;
  s.adopt_to = n;
  s.tables.assign(tw_.size(), std::vector<int32_t>(size_t(want), -1));
  // The leading blocks every table has in its index (or does not need):
  // they are not sent. The chain is walked until the first block missed.
  int64_t hits = 0;
  if (caching_)
    walk_chain(prompt, bs_, scope, [&](int64_t i, const BlockKey& k) {
      std::vector<int32_t> found(tw_.size(), -1);
      for (size_t t = 0; t < tw_.size(); ++t) {
        if (!needs(t, i)) continue;
        const auto b = pool_.lookup(table_key(k, int(t)));
        if (!b) return false;
        found[t] = *b;
      }
      for (size_t t = 0; t < tw_.size(); ++t)
        if (found[t] >= 0) {
          pool_.share(found[t]);
          s.tables[t][size_t(i)] = found[t];
        }
      s.keys.push_back(k);
      ++hits;
      return true;
    });
  // Block by block, each table's entry: the order both ends of a transfer
  // list a prompt's blocks in (disagg/adoption_pool.h).
  Adoption a;
  for (int64_t i = 0; i < want; ++i)
    for (size_t t = 0; t < tw_.size(); ++t)
      if (needs(t, i)) {
        if (i < hits) ++a.hit_entries;
        else a.fresh.push_back({int32_t(t), int32_t(i)});
      }
  if (int64_t(a.fresh.size()) > pool_.n_available()) {
    for (int64_t i = hits - 1; i >= 0; --i)
      for (size_t t = 0; t < tw_.size(); ++t)
        if (s.tables[t][size_t(i)] >= 0) pool_.release(s.tables[t][size_t(i)]);
    return {};
  }
  for (const auto& [t, i] : a.fresh) s.tables[size_t(t)][size_t(i)] = alloc_one(t);
  s.tokens.assign(prompt.begin(), prompt.begin() + hits * bs_);
  s.residual.assign(residual_floats_, 0.0f);
  if (caching_) {
    query_tokens_ += n;
    hit_tokens_ += hits * bs_;
  }
  a.seq = next_id_++;
  a.hit_blocks = int32_t(hits);
  a.blocks = int32_t(want);
  seqs_.emplace(a.seq, std::move(s));
  return a;
}

void KvManager::finish_adoption(SeqId seq, std::span<const int32_t> prompt) {
  Seq& s = get(seq);
  const size_t have = s.tokens.size();
  if (have > prompt.size() || !std::equal(s.tokens.begin(), s.tokens.end(), prompt.begin()) ||
      int64_t(prompt.size()) != s.adopt_to)
    throw bug("finish_adoption with a prompt other than the reserved one");
  commit(seq, prompt.subspan(have));
  get(seq).adopt_to = 0;
}

std::vector<BlockKey> KvManager::chain_keys(std::span<const int32_t> prompt, const Scope& scope,
                                            int64_t max_blocks) const {
  return kvs::chain_keys(prompt, bs_, scope, max_blocks);
}

std::vector<BlockKey> KvManager::table_keys(std::span<const int32_t> prompt, const Scope& scope) const {
  std::vector<BlockKey> out;
  walk_chain(prompt, bs_, scope, [&](int64_t, const BlockKey& k) {
    for (size_t t = 0; t < tw_.size(); ++t) out.push_back(table_key(k, int(t)));
    return true;
  });
  return out;
}

int32_t KvManager::cached_prefix_blocks(std::span<const int32_t> prompt, const Scope& scope) const {
  if (!caching_) return 0;
  return int32_t(hit_of(walk_hits(prompt, scope, nullptr), int64_t(prompt.size())));
}

KvManager::PrefixProbe KvManager::probe_prefix(std::span<const int32_t> tokens, const Scope& scope) const {
  PrefixProbe p;
  if (!caching_) return p;
  const int64_t n = int64_t(tokens.size());
  const HitWalk w = walk_hits(tokens, scope, nullptr);
  p.hits = hit_of(w, n);
  for (size_t t = 0; t < tw_.size(); ++t)
    for (int64_t i = 0; i < p.hits; ++i)
      if (hit_holds(t, i, p.hits, n))
        if (const auto b = pool_.lookup(w.tkeys[t][size_t(i)])) p.revived += pool_.state(*b) == BlockState::Cached;
  return p;
}

}  // namespace kvs
