// Which cached tokens a query sees, and at which RoPE positions: the policy
// that bounds a sequence's KV memory (--kv-window/--kv-sinks, --ctx-shift)
// or that the model itself declares (Mistral-style native sliding window).
//
// Everything is a function of the text index p of the query token, so the
// result never depends on chunking or on when blocks were freed:
//   visible keys   [0, sink_end) ∪ [win_start, p]
//   key position   i            for i < sink_end
//                  i - shift    for i >= win_start
//   query position p - shift
// Kinds:
//   None         everything visible, positions = text indices.
//   Native       model-declared window W (Mistral): win_start = p - W + 1,
//                positions stay text indices (the model was trained so).
//   Streaming    StreamingLLM: the first S tokens (attention sinks) and the
//                last W tokens. Positions are those of a rolling cache holding
//                exactly these tokens: sinks at 0..S-1, the window right after
//                them (shift = win_start - S), so the query sits at S + W - 1
//                once the window is full. S = 0 is plain window attention.
//   ContextShift llama.cpp's context shift: a cache of C tokens; when it is
//                full, the n_keep first tokens stay and half of the rest is
//                discarded; later tokens move down by the discarded count.
// Keys of a policy that shifts (Streaming, ContextShift) are stored before
// RoPE and rotated at attention time to their current position (rotates());
// the cost is one rotation per visible key per query. Blocks whose tokens
// no later query can see are freed (dead_range).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kv_groups.h"

namespace kvs {

enum class WindowKind { None, Native, Streaming, ContextShift };

struct WindowView {
  int sink_end = 0;   // keys [0, sink_end) visible
  int win_start = 0;  // keys [win_start, p] visible
  int shift = 0;      // RoPE position = index - shift for keys >= win_start and for the query
};

struct WindowPolicy {
  WindowKind kind = WindowKind::None;
  int sinks = 0;   // Streaming
  int window = 0;  // Streaming, Native: visible recent tokens, the query included
  int keep = 0;    // ContextShift: n_keep
  int ctx = 0;     // ContextShift: cache size C
  // Streaming only: keep text indices as positions (naive dropping; the
  // query's distance to the sinks then grows without bound). For contrast.
  bool text_positions = false;

  static WindowPolicy streaming(int window, int sinks, bool text_positions = false) {
    return {WindowKind::Streaming, sinks, window, 0, 0, text_positions};
  }
  static WindowPolicy native(int window) { return {WindowKind::Native, 0, window, 0, 0, false}; }
  static WindowPolicy context_shift(int ctx, int keep) { return {WindowKind::ContextShift, 0, 0, keep, ctx, false}; }

  bool active() const { return kind != WindowKind::None; }
  // The policy in force: this one, or the model's native window (its
  // metadata's sliding_window, 0 = none) when this one is None.
  WindowPolicy resolve(int model_sliding_window) const {
    return !active() && model_sliding_window > 0 ? native(model_sliding_window) : *this;
  }
  // resolve(), then validate(): the policy a sequence keeps from the moment
  // it starts (the engine reads it per chunk and never resolves again).
  WindowPolicy in_force(int model_sliding_window) const {
    const WindowPolicy p = resolve(model_sliding_window);
    p.validate();
    return p;
  }
  bool rotates() const {
    return (kind == WindowKind::Streaming && !text_positions) || kind == WindowKind::ContextShift;
  }
  WindowView view(int p) const;
  // Keys [first, second) that no query at index >= p can see.
  std::pair<int, int> dead_range(int p) const { const WindowView v = view(p); return {v.sink_end, v.win_start}; }
  // Most tokens visible to one query (bounds the live cache): sinks + window,
  // or the context-shift cache size; 0 = unbounded (None).
  int max_visible() const;
  // Throws std::invalid_argument naming the broken rule.
  void validate() const;
  std::string describe() const;
};

// What the layers of one KV table (kernels/kv_groups.h) see: the sequence's
// policy, and on top of it the layers' own sliding window (0 = none), under
// which the query at text index p sees key k only if p - k < layer_window
// (the peers' SWA mask, as the attention applies it). A table frees the
// blocks neither lets any later query see.
struct TableWindow {
  WindowPolicy policy;
  int layer_window = 0;

  bool frees() const { return policy.active() || layer_window > 0; }
  // True when no query at index >= p sees any key of [a, b). Once true it
  // stays true for every later p (both hidden sets only grow).
  bool dead(int64_t a, int64_t b, int p) const;
  // Most blocks one sequence holds in this table (window_block_cap of the
  // policy and of the layer window, the smaller); INT64_MAX: unbounded.
  int64_t block_cap(int block_size, int max_step_tokens) const;
};

// The windows of a cache's KV tables: the sequence's policy with each
// table's own window (KvGroups::table_windows; no tables: one, no window).
std::vector<TableWindow> table_windows(const WindowPolicy& policy, const KvGroups& groups);
// Most blocks one sequence of up to `tokens` tokens holds, all tables
// together: per table its blocks, at most its block_cap.
int64_t sequence_block_cap(const std::vector<TableWindow>& tables, int64_t tokens, int block_size,
                           int max_step_tokens);

// Most blocks of `block_size` slots that one sequence under policy `w` ever
// holds, when a step appends at most `max_step_tokens` tokens: its visible
// tokens may straddle two extra partial blocks (sink and window edges), plus
// the blocks of one step. INT64_MAX when the policy does not bound memory.
// The one formula behind KvManager::live_cap, pool sizing and LocalSequence.
int64_t window_block_cap(const WindowPolicy& w, int block_size, int max_step_tokens);

}  // namespace kvs
