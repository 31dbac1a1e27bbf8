// Sequences and their block tables over one BlockPool: prefix-cache lookup
// on admission, block reservation before a forward (with copy-on-write of a
// block the sequence does not own alone), registration of newly full blocks
// after it, forks and release. Plain data in and out (vLLM v1 style): the
// scheduler asks, the manager answers yes with blocks or no, and nothing else
// reaches inside the pool.
//
// Life of a sequence:
//   add_sequence(prompt, scope) -> {seq, cached}: the table already holds the
//       longest cached chain of the prompt's full blocks; the caller must feed
//       prompt[cached..] next (cached <= prompt.size() - 1, so the last prompt
//       token always goes through the model and yields logits).
//   reserve(seq, n)  -> bool: table covers tokens() + n, every block that the
//       next n tokens will be written into is owned alone and unkeyed.
//   Engine::forward over block_table(seq)
//   commit(seq, tokens): the n tokens now have K/V; newly full blocks get
//       their chained key and enter the prefix index.
//   fork(seq) -> child sharing every block;  release(seq).
// Under a window policy (KvManagerOptions::window) commit() also releases
// the blocks the window has left behind: a sequence then holds at most the
// blocks of its visible tokens, however long it grows.
//
// Hybrid cache (kernels/kv_groups.h, KvManagerOptions::table_windows): a
// sequence holds one block table per KV table, all of the same logical
// length over the one pool. Each table has its own window (TableWindow: the
// policy, and on top of it its layers' own sliding window) and frees what
// that window left behind, so a windowed table holds at most
// TableWindow::block_cap blocks. The chain key of logical block i is shared;
// table t's physical block is indexed under table_key(key_i, t)
// (kv/prefix_chain.h). A prefix hit is valid only when every table has the
// blocks the next query can see (kv/prefix_hits.h). Every count the
// scheduler reads (blocks_needed, horizon_blocks, live_cap, exclusive_blocks,
// stats) is the sum over the tables. With one table (every model whose
// layers share a window) all of this is exactly the one-table manager.
//
// Two rules make sharing safe: a keyed (content-addressed) block is never
// written again, and a block with ref count > 1 is never written; reserve()
// copies such a block into a fresh one first (BlockStorage::copy_block).
//
// Threads: one writer, the owner thread (the engine thread while serving;
// kv/owner_thread.h checks every mutating call in builds with assertions).
// Other threads may call only the const prefix probes marked thread-safe;
// what else they need of the pool they post to the engine loop
// (sched/pool_command.h).
#pragma once
#include <cstdint>
#include <climits>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_tier_port.h"
#include "kv/prefix_hash.h"
#include "kv/window_policy.h"

namespace kvs {

class BlockStorage;

using SeqId = int64_t;

struct KvManagerOptions {
  int block_size = 16;        // token slots per block (>= 1 here; the user-facing option is 8..256)
  bool prefix_caching = true;
  // Quantized KV cache: token groups of this many tokens are stored only when
  // complete, so a prompt served from the cache must stop at a group
  // boundary (1 = any token), and each sequence carries a full-precision
  // residual of `residual_floats` floats (KvLayout::residual_floats()).
  int align_tokens = 1;
  size_t residual_floats = 0;
  // A window policy (already resolved with the model's native window):
  // after each commit, blocks whose tokens no later query of the sequence
  // can see are released and their table entries become -1.
  WindowPolicy window;
  int max_step_tokens = 512;  // window policy: most tokens one step appends (bounds live_cap)
  // One entry per KV table (KvGroups::table_windows): the sliding window of
  // its layers, 0 = the whole context. Empty: one table, no window of its own.
  std::vector<int> table_windows;

  // Full-precision cache, no window: the common case, without spelling the rest.
  static KvManagerOptions basic(int block_size, bool prefix_caching) {
    KvManagerOptions o;
    o.block_size = block_size;
    o.prefix_caching = prefix_caching;
    return o;
  }
};

struct SeqAdmission {
  SeqId seq = -1;
  int cached_tokens = 0;    // prompt tokens whose K/V came from the cache
  int imported_tokens = 0;  // of those, tokens loaded from a lower tier
};

// Pool-wide accounting. "Slots" are token positions in blocks.
struct KvStats {
  int32_t block_size = 0;
  int64_t total_blocks = 0, free_blocks = 0, cached_blocks = 0, used_blocks = 0;
  int64_t sequences = 0;
  int64_t seq_tokens = 0;     // Σ tokens over sequences (a shared prefix counts once per sequence)
  int64_t seq_blocks = 0;     // Σ table lengths (a shared block counts once per holder)
  int64_t stored_tokens = 0;  // slots of Used blocks that hold a token (each block once)
  int64_t waste_slots = 0;    // used_blocks × block_size − stored_tokens: internal fragmentation
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;  // over add_sequence calls
  int64_t cow_copies = 0;
  int64_t evictions = 0;
  int64_t imported_blocks = 0;  // blocks add_sequence loaded from a lower tier
  int64_t residual_bytes = 0;  // full-precision residuals of the sequences (quantized KV cache)
  std::vector<int64_t> table_blocks;  // [n_tables] Used blocks serving each KV table (sum: used_blocks)
};

struct SeqInfo {
  int tokens = 0;          // tokens with K/V in the cache
  int blocks = 0;          // blocks held, every table (reserved included; blocks freed by a window not counted)
  int shared_blocks = 0;   // blocks of the tables with ref count > 1
};

class KvManager {
 public:
  // `storage` (may be null in pure bookkeeping tests) receives the
  // copy-on-write copies; it must have n_blocks blocks of this block size.
  KvManager(int32_t n_blocks, const KvManagerOptions& opts, BlockStorage* storage = nullptr);

  int block_size() const { return bs_; }
  bool prefix_caching() const { return caching_; }
  int n_tables() const { return int(tw_.size()); }
  const TableWindow& table_window(int table) const { return tw_[size_t(table)]; }
  const BlockPool& pool() const { return pool_; }

  // With an importer, the chain continues past the first RAM miss with
  // blocks the importer has ready (a lower tier): each goes into a fresh
  // block, is keyed, and counts as cached (SeqAdmission::imported_tokens).
  // use_cache false: nothing is taken from the cache (every prompt position
  // is computed, e.g. for prompt logprobs); the blocks are still keyed after.
  SeqAdmission add_sequence(std::span<const int32_t> prompt, const Scope& scope, BlockImporter* importer = nullptr,
                            bool use_cache = true);
  // Disaggregated decode: a prompt whose K/V another worker computed. Pins
  // the prompt's cached full blocks (RAM hits, which need not travel) and
  // reserves fresh blocks for the rest of the prompt, all or nothing
  // (seq == -1: no room, nothing changed). The fresh blocks are the
  // sequence's own and unkeyed until finish_adoption, so their bytes may be
  // written from another thread meanwhile. Abandon with release(seq).
  // With several tables each table pins what its index has and reserves
  // the other blocks the prompt's next query sees (a windowed table: only
  // those; its other entries stay -1).
  struct Adoption {
    SeqId seq = -1;
    int32_t hit_blocks = 0;  // logical blocks [0, hit_blocks) came from the prefix index (every table)
    int32_t blocks = 0;      // table length: every block the prompt touches
    // The prompt's entries, block by block and each table's in table order,
    // that the next query sees (every entry of a full table): the first
    // hit_entries of them came from the index; `fresh` are the rest,
    // (table, logical block), to be written. One table: hit_entries =
    // hit_blocks, fresh = (0, hit_blocks .. blocks-1).
    int32_t hit_entries = 0;
    std::vector<std::pair<int32_t, int32_t>> fresh;
  };
  Adoption reserve_adoption(std::span<const int32_t> prompt, const Scope& scope);
  // The reserved blocks now hold the prompt's K/V: its tokens count as
  // written and its full blocks are keyed into the prefix index, as if this
  // manager had computed them.
  void finish_adoption(SeqId seq, std::span<const int32_t> prompt);
  // The chain keys of the prompt's full blocks (at most max_blocks).
  // Thread-safe (pure).
  std::vector<BlockKey> chain_keys(std::span<const int32_t> prompt, const Scope& scope,
                                   int64_t max_blocks = INT64_MAX) const;
  // The index key of every table's block of the prompt's full blocks, block
  // by block, table 0 first (kv/prefix_chain.h, table_key): what a lower
  // tier is asked for. With one table: the chain keys. Thread-safe (pure).
  std::vector<BlockKey> table_keys(std::span<const int32_t> prompt, const Scope& scope) const;
  // Called on every block this manager keys after a forward (not on imported
  // ones): what a lower tier writes behind. Engine thread.
  // `parent`: the key of the chain's previous block in the same table
  // (nullptr for a chain's first block).
  using KeyedHook = void (*)(void* ctx, int32_t block, const BlockKey& key, const BlockKey* parent, const Scope& scope);
  void set_keyed_hook(KeyedHook hook, void* ctx) {
    owner_.check("KvManager::set_keyed_hook");
    keyed_hook_ = hook;
    keyed_ctx_ = ctx;
  }
  // Full prompt blocks that add_sequence would find cached now (no state
  // change). Thread-safe: only this and the immutable options may be read
  // from other threads while the engine thread runs (BlockPool::lookup).
  int32_t cached_prefix_blocks(std::span<const int32_t> prompt, const Scope& scope) const;

  // Admission costs, for the scheduler (engine thread). What adding `tokens`
  // would find in the prefix index: full (logical) blocks hit in every
  // table, and how many physical blocks of those the tables would pin are
  // Cached now (unreferenced: reusing them pins blocks the LRU could
  // otherwise hand out).
  struct PrefixProbe {
    int64_t hits = 0, revived = 0;
  };
  PrefixProbe probe_prefix(std::span<const int32_t> tokens, const Scope& scope) const;
  // Blocks of `seq`'s table no other sequence holds: what releasing it frees.
  int64_t exclusive_blocks(SeqId seq) const;
  int32_t total_blocks() const { return pool_.size(); }
  int32_t used_blocks() const { return pool_.n_used(); }
  int32_t available_blocks() const { return pool_.n_available(); }  // free + evictable

  // Blocks reserve(seq, n_new) would take from the pool (new + copies).
  int32_t blocks_needed(SeqId seq, int n_new) const;
  // Worst-case blocks the sequence may still take from the pool on its way
  // to `horizon` tokens (admission estimates): blocks_needed, but under a
  // bounding window at most live_cap() minus the blocks it holds now.
  int64_t horizon_blocks(SeqId seq, int64_t horizon) const;
  // Most blocks one sequence can hold at once under a bounding window
  // policy: its visible tokens, two partly visible edge blocks and one
  // step's new blocks, summed over the tables. INT64_MAX when some table
  // is unbounded.
  int64_t live_cap() const;
  // The same bound for one table (TableWindow::block_cap).
  int64_t table_cap(int table) const { return caps_[size_t(table)]; }
  // `blocks` (what one table would need without a window) for each table,
  // at most `mult` × that table's cap, summed: the scheduler's worst-case
  // arithmetic per group. One table: min(blocks, mult × live_cap()). Reads
  // only the caps, fixed at construction: any thread may call it.
  int64_t bounded(int64_t blocks, int64_t mult = 1) const;
  // All or nothing: false leaves the sequence and the pool as they were.
  bool reserve(SeqId seq, int n_new);
  // Returns reserved blocks that hold no token (e.g. after a batch that
  // could not run).
  void unreserve(SeqId seq);
  // The tokens just written by a forward (must fit the reservation).
  void commit(SeqId seq, std::span<const int32_t> tokens);

  SeqId fork(SeqId parent);
  // Tail block first, so a released chain's tail is evicted before its head.
  void release(SeqId seq);
  // Every cached (unreferenced) block becomes free: a cold cache.
  void drop_cached() {
    owner_.check("KvManager::drop_cached");
    pool_.drop_cached();
  }

  // The caller's monotonic time (any unit, e.g. ms); stamped as the last use
  // of blocks shared, keyed or released from now on. The manager reads no
  // clock itself.
  void set_tick(int64_t tick) {
    owner_.check("KvManager::set_tick");
    pool_.set_tick(tick);
  }
  // Drops the prefix cache of `scope` (a revoked tenant): every cached block
  // keyed under it becomes free at once, and blocks of it still held by a
  // running sequence lose their key, so they can never be hit again and go
  // free (not cached) when their last holder releases them. Sequences of the
  // scope that are live now key no new blocks until they end. Returns the
  // cached blocks freed now.
  int32_t drop_cached_scope(const Scope& scope);
  // Cached blocks of `scope` whose last use (tick) is before `cutoff` become
  // free (a retention TTL). Blocks held by sequences are not touched. Returns
  // how many were freed.
  int32_t drop_cached_older_than(const Scope& scope, int64_t cutoff) {
    owner_.check("KvManager::drop_cached_older_than");
    return pool_.drop_cached_older_than(scope, cutoff);
  }

  // Records prefix-index changes into `log` (not owned; null = stop): a
  // Stored event per newly keyed block, a Removed event per key that leaves
  // (kv/kv_events.h). Engine thread only, like every mutating call.
  void set_event_log(KvEventLog* log) {
    owner_.check("KvManager::set_event_log");
    events_ = log;
    pool_.set_event_log(log);
  }

  // The one thread that changes this manager and its pool from now on: the
  // engine thread binds itself when it starts (kv/owner_thread.h).
  void bind_owner_thread() const {
    owner_.bind();
    pool_.bind_owner_thread();
  }

  bool contains(SeqId seq) const { return seqs_.count(seq) != 0; }
  // The sequence's block table of KV table `table` (logical block -> physical
  // block, -1: freed by that table's window).
  const std::vector<int32_t>& block_table(SeqId seq, int table = 0) const { return get(seq).tables.at(size_t(table)); }
  const std::vector<std::vector<int32_t>>& block_tables(SeqId seq) const { return get(seq).tables; }
  // Which table a Used or Cached block serves (-1: a free block).
  int table_of_block(int32_t block) const { return block_table_[size_t(block)]; }
  const std::vector<int32_t>& tokens(SeqId seq) const { return get(seq).tokens; }
  // The sequence's full-precision residual (SeqChunk::residual); null when
  // the cache needs none. Written by Engine::forward.
  float* residual(SeqId seq) {
    Seq& s = get(seq);
    return s.residual.empty() ? nullptr : s.residual.data();
  }
  int num_tokens(SeqId seq) const { return int(get(seq).tokens.size()); }
  std::span<const float> residual_view(SeqId seq) const { return get(seq).residual; }
  SeqInfo seq_info(SeqId seq) const;
  const Scope& scope(SeqId seq) const { return get(seq).scope; }  // as its blocks are keyed
  std::vector<SeqId> sequences() const;  // ascending
  KvStats stats() const;

  // Pool invariants plus: every block's ref count equals the number of table
  // entries naming it; blocks a sequence will write are owned alone and
  // unkeyed; a keyed full block's key is the sequence's chain key at that
  // index; the fill record covers every token. `deep` also recomputes each
  // sequence's key chain from its tokens (SHA-256 per block: slow).
  // Throws std::logic_error naming the first violation.
  void check_invariants(bool deep = false) const;

 private:
  struct Seq {
    std::vector<int32_t> tokens;  // tokens with K/V written (prompt prefix + generated)
    // Per KV table: physical block per logical block; may extend past tokens
    // (reserved); -1: released because the table's window hides it from
    // every later token (or never needed by it). All tables have one length.
    std::vector<std::vector<int32_t>> tables;
    std::vector<BlockKey> keys;   // chain key of each full block (empty without prefix caching)
    Scope scope;
    std::vector<float> residual;  // [residual_floats] (quantized KV cache)
    int64_t adopt_to = 0;  // an adoption in progress: the prompt length its tables are laid out for
  };
  // A prompt's admission through the prefix index (kv_manager_admit.cpp).
  struct HitWalk;
  Seq& get(SeqId seq);
  const Seq& get(SeqId seq) const;
  bool must_copy(int32_t block) const { return pool_.ref_count(block) > 1 || pool_.has_key(block); }
  int32_t alloc_one(int table);  // pool has room: checked by the caller
  void free_dead(Seq& s);  // window policy: release blocks no later token sees
  void check_table(const Seq& s, size_t t, const std::string& sid, std::vector<int32_t>& holders) const;
  void register_keys(Seq& s);  // chain keys of blocks now full
  int64_t held(const Seq& s, size_t t) const;  // blocks of table t not freed
  // The prompt's chain through every table's index (and the importer's
  // staged blocks): what each table could take from the cache. Pure when
  // importer is null (then any thread may call it: BlockPool::lookup).
  HitWalk walk_hits(std::span<const int32_t> prompt, const Scope& scope, BlockImporter* importer) const;
  int64_t hit_of(const HitWalk& w, int64_t prompt_tokens) const;  // largest_hit
  // Whether table t holds block i when a hit of h blocks is laid out.
  bool hit_holds(size_t t, int64_t i, int64_t h, int64_t prompt_tokens) const;
  // Pins the prompt's cached blocks each table needs (and imports the rest
  // the importer has); returns the cached tokens and the imported ones.
  std::pair<int64_t, int64_t> admit_cached(Seq& s, std::span<const int32_t> prompt, BlockImporter* importer);
  // Makes s's tables hold what a hit of h blocks needs, keeping what they
  // hold already: -1 when done, else the logical block whose import failed
  // (its table in *failed_table).
  int64_t materialize(Seq& s, const HitWalk& w, int64_t h, int64_t n, BlockImporter* importer, int* failed_table,
                      int64_t* first_import);

  int bs_;
  bool caching_;
  int align_;
  size_t residual_floats_;
  WindowPolicy window_;
  int max_step_;
  std::vector<TableWindow> tw_;  // [n_tables]
  std::vector<int64_t> caps_;    // [n_tables] TableWindow::block_cap
  BlockPool pool_;
  BlockStorage* storage_;
  std::vector<int32_t> fill_;  // per block: leading slots holding valid K/V
  std::vector<int8_t> block_table_;  // per block: the table it was taken for (-1: never taken)
  std::unordered_map<SeqId, Seq> seqs_;
  SeqId next_id_ = 0;
  int64_t query_tokens_ = 0, hit_tokens_ = 0, cow_copies_ = 0, imported_ = 0;
  KeyedHook keyed_hook_ = nullptr;
  void* keyed_ctx_ = nullptr;
  // Scopes dropped while sequences of them were live: their new full blocks
  // get no key. An entry leaves when the last such sequence is released.
  std::vector<Scope> dropped_;
  bool is_dropped(const Scope& s) const;
  KvEventLog* events_ = nullptr;
  OwnerThread owner_;
  // Stored event for table t's block of logical block i of a chain
  // (`tokens`: its block_size ids).
  void note_stored(int32_t block, const std::vector<BlockKey>& keys, int64_t i, int t, const int32_t* tokens);
  // Keys table t's block b of logical block i (chain keys `keys`); false
  // when the key already names another block. Stored event and keyed hook.
  bool key_block(int32_t b, const std::vector<BlockKey>& keys, int64_t i, int t, const Scope& scope,
                 const int32_t* tokens, bool hook);
};

}  // namespace kvs
