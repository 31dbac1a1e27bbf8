#include "engine/paged_engine.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kv/capacity.h"
#include "kv/prefix_chain.h"
#include "model/model.h"
#include "tokenizer/vocab.h"

namespace kvs {

void check_block_size_option(int bs) {
  if (bs < kMinUserBlockSize || bs > kMaxUserBlockSize)
    throw std::invalid_argument("--block-size must be between " + std::to_string(kMinUserBlockSize) + " and " +
                                std::to_string(kMaxUserBlockSize) + " tokens, got " + std::to_string(bs));
}

int64_t kv_blocks_for_budget(const Engine& engine, int block_size, uint64_t bytes, const KvCacheOptions& cache) {
  const ModelConfig& c = engine.model().config();
  const KvLayout l = kv_layout_for(engine, block_size, cache);
  if (cache.type == KvType::F32) {
    // The capacity arithmetic (planner, admission) and the storage layout
    // must agree byte for byte, or admission would promise blocks that do
    // not exist. (A hybrid layout's token costs one slot per layer slot of
    // every table: the padded layer count.)
    const int slots = l.slots() * l.n_tables();
    const uint64_t per_token = kv_bytes_per_token(slots, c.n_kv_heads, c.head_dim, KvFormat::f32());
    if (per_token != l.bytes_per_token())
      throw std::logic_error("KV bytes per token: capacity helper and storage layout disagree");
  }
  return int64_t(bytes / l.block_bytes());
}

static int64_t pool_blocks(const Engine& e, const PagedEngineOptions& o, int max_ctx, const WindowPolicy& w) {
  const KvLayout layout = kv_layout_for(e, o.block_size, o.cache);
  if (o.block_size < 1 || o.block_size > kMaxUserBlockSize)
    throw std::invalid_argument("block size must be between 1 and " + std::to_string(kMaxUserBlockSize) +
                                " tokens, got " + std::to_string(o.block_size));
  if (max_ctx < 1) throw std::invalid_argument("max context must be >= 1 token");
  int64_t n = o.n_blocks;
  if (o.kv_memory_bytes > 0) n = kv_blocks_for_budget(e, o.block_size, o.kv_memory_bytes, o.cache);
  else if (n <= 0) throw std::invalid_argument("paged engine: give a KV memory budget (--kv-memory) or a block count");
  // A bounding window: one sequence never holds more (KvManager::live_cap),
  // per KV table.
  const int64_t need =
      sequence_block_cap(table_windows(w, layout.groups), max_ctx, o.block_size, o.max_step_tokens);
  if (n < need) {
    const uint64_t block_bytes = layout.block_bytes();
    throw std::invalid_argument(
        "KV budget too small: " + std::to_string(n) + " blocks of " + std::to_string(o.block_size) + " tokens (" +
        std::to_string(block_bytes) + " bytes each) cannot hold one " + std::to_string(max_ctx) +
        "-token sequence, which needs " + std::to_string(need) + " blocks = " + std::to_string(uint64_t(need) * block_bytes) +
        " bytes; raise --kv-memory or lower the context size");
  }
  if (n > INT32_MAX) throw std::invalid_argument("KV budget holds more than 2^31 blocks; raise --block-size");
  return n;
}

static KvManagerOptions manager_options(const KvLayout& l, const PagedEngineOptions& o, const WindowPolicy& w) {
  KvManagerOptions m;
  m.block_size = o.block_size;
  m.prefix_caching = o.prefix_caching;
  m.window = w;
  m.max_step_tokens = o.max_step_tokens;
  m.table_windows = l.groups.table_windows();
  if (l.quantized()) {
    m.align_tokens = l.group_tokens;
    m.residual_floats = l.residual_floats();
  }
  return m;
}

static int resolve_ctx(const Engine& e, int max_ctx) {
  if (max_ctx > 0) return max_ctx;
  const int train = e.model().config().n_ctx_train;
  return train > 0 ? train : 2048;
}

PagedEngine::PagedEngine(Engine& engine, const PagedEngineOptions& opts)
    : engine_(engine),
      max_ctx_(resolve_ctx(engine, opts.max_ctx)),
      window_(opts.window.in_force(engine.model().config().sliding_window)),
      storage_(std::make_unique<BlockStorage>(kv_layout_for(engine, opts.block_size, opts.cache),
                                              pool_blocks(engine, opts, max_ctx_, window_))),
      kv_(int32_t(storage_->n_blocks()), manager_options(storage_->view().layout, opts, window_), storage_.get()) {}

struct PagedEngine::TierImporter final : BlockImporter {
  KvTierPort& tier;
  BlockStorage& storage;
  TierImporter(KvTierPort& t, BlockStorage& s) : tier(t), storage(s) {}
  bool ready(const BlockKey& key) override { return tier.staged(key); }
  bool fill(const BlockKey& key, int32_t block) override { return tier.take(key, storage.block(block)); }
};

// What add() and reserve_adoption() both require of a prompt: tokens, at
// most `limit` of them, every id in the vocabulary.
void PagedEngine::check_prompt(std::span<const int32_t> prompt, int64_t limit) const {
  if (prompt.empty()) throw std::invalid_argument("paged engine: a prompt needs at least one token");
  if (int64_t(prompt.size()) > limit)
    throw std::length_error("prompt of " + std::to_string(prompt.size()) + " tokens " +
                            (limit < max_ctx_ ? "leaves no room in" : "exceeds") + " the context size " +
                            std::to_string(max_ctx_));
  if (const std::string e = token_ids_error(prompt, engine_.model().config().n_vocab, "paged engine: prompt");
      !e.empty())
    throw std::invalid_argument(e);
}

SeqAdmission PagedEngine::add(std::span<const int32_t> prompt, const Scope& scope, bool use_cache) {
  check_prompt(prompt, max_ctx_);
  return kv_.add_sequence(prompt, kv_scope(scope), use_cache ? importer_.get() : nullptr, use_cache);
}

PagedEngine::~PagedEngine() = default;

KvManager::Adoption PagedEngine::reserve_adoption(std::span<const int32_t> prompt, const Scope& caller) {
  if (window_.active())
    throw std::invalid_argument("paged engine: a windowed cache cannot adopt transferred blocks");
  check_prompt(prompt, max_ctx_ - 1);  // the first token is fed next
  return kv_.reserve_adoption(prompt, kv_scope(caller));
}


void PagedEngine::set_tier(KvTierPort* tier) {
  tier_ = tier;
  importer_ = tier ? std::make_unique<TierImporter>(*tier, *storage_) : nullptr;
  kv_.set_keyed_hook(tier ? &PagedEngine::on_keyed : nullptr, this);
}

void PagedEngine::on_keyed(void* self, int32_t block, const BlockKey& key, const BlockKey* parent, const Scope& scope) {
  auto* pe = static_cast<PagedEngine*>(self);
  pe->tier_->offer(key, scope, pe->storage_->block(block), parent);
}

uint64_t PagedEngine::prefetch(std::span<const int32_t> prompt, const Scope& caller, double retention_s) const {
  if (!tier_ || !kv_.prefix_caching()) return 0;
  const Scope scope = kv_scope(caller);
  // Every table's block of each full prompt block (table 0's key is the
  // chain key): with a hybrid cache a hit needs each table's blocks.
  std::vector<BlockKey> keys = kv_.table_keys(prompt, scope);
  // Blocks RAM holds now need no fetch (it may evict them before admission:
  // then they are recomputed, as without a tier).
  size_t first = 0;
  while (first < keys.size() && kv_.pool().lookup(keys[first])) ++first;
  keys.erase(keys.begin(), keys.begin() + std::ptrdiff_t(first));
  return tier_->prefetch(std::move(keys), scope, retention_s);
}

int32_t PagedEngine::drop_cached_scope(const Scope& caller) {
  const Scope scope = kv_scope(caller);
  if (tier_) tier_->drop_scope(scope);
  return kv_.drop_cached_scope(scope);
}

Scope PagedEngine::kv_scope(const Scope& caller) const { return kvs::kv_scope(engine_.model().identity(), caller); }

void PagedEngine::step(const std::vector<SeqStep>& items, StepResult& r) {
  r.ok = false;
  r.no_room.clear();
  r.row0.clear();
  r.n_vocab = engine_.model().config().n_vocab;
  ids_.clear();
  for (const SeqStep& it : items) ids_.push_back(it.seq);
  std::sort(ids_.begin(), ids_.end());
  if (auto d = std::adjacent_find(ids_.begin(), ids_.end()); d != ids_.end())
    throw std::invalid_argument("paged engine: sequence " + std::to_string(*d) + " twice in one step");
  for (const SeqStep& it : items) {
    if (it.tokens.empty()) throw std::invalid_argument("paged engine: step item without tokens");
    if (int64_t(kv_.num_tokens(it.seq)) + int64_t(it.tokens.size()) > max_ctx_)
      throw std::length_error("sequence " + std::to_string(it.seq) + " would exceed the context size " +
                              std::to_string(max_ctx_));
  }
  // Reserve for everyone or run nobody: a partial batch would leave the
  // scheduler guessing which sequences advanced.
  size_t reserved = 0;
  for (; reserved < items.size(); ++reserved)
    if (!kv_.reserve(items[reserved].seq, int(items[reserved].tokens.size()))) break;
  if (reserved < items.size()) {
    for (size_t i = 0; i < reserved; ++i) kv_.unreserve(items[i].seq);
    r.no_room.push_back(items[reserved].seq);
    // Report every sequence that could not fit on its own either.
    for (size_t i = reserved + 1; i < items.size(); ++i)
      if (kv_.blocks_needed(items[i].seq, int(items[i].tokens.size())) > kv_.pool().n_available())
        r.no_room.push_back(items[i].seq);
    r.logits.clear();
    return;
  }
  chunks_.clear();
  const size_t n_tables = size_t(kv_.n_tables());
  table_ptrs_.resize(items.size() * n_tables);  // stable while chunks_ points into it
  int64_t rows = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const SeqStep& it = items[i];
    const auto& tables = kv_.block_tables(it.seq);
    for (size_t t = 0; t < n_tables; ++t) table_ptrs_[i * n_tables + t] = tables[t].data();
    chunks_.push_back(SeqChunk{tables[0].data(), kv_.num_tokens(it.seq), it.tokens.data(), int(it.tokens.size()),
                               it.all_logits, kv_.residual(it.seq), &window_});
    if (n_tables > 1) chunks_.back().block_tables = &table_ptrs_[i * n_tables];
    r.row0.push_back(rows);
    rows += it.all_logits ? int64_t(it.tokens.size()) : 1;
  }
  if (chunks_.empty()) r.logits.clear();
  else engine_.forward(chunks_, storage_->view(), r.logits);
  for (const SeqStep& it : items) {
    kv_.commit(it.seq, it.tokens);
    forward_tokens_ += int64_t(it.tokens.size());
  }
  ++steps_;
  r.ok = true;
}

PagedStats PagedEngine::stats() const {
  PagedStats s;
  s.kv = kv_.stats();
  s.forward_tokens = forward_tokens_;
  s.steps = steps_;
  s.kv_bytes = int64_t(storage_->bytes());
  return s;
}

}  // namespace kvs
