#include "tools/ram_budget.h"

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "kv/window_policy.h"
#include "tools/plan.h"
#include "tools/units.h"

namespace kvs::tools {

namespace {

std::string quality_of(KvType t) {
  // docs/KV-QUALITY.md, stories260K, keys per channel at the default group.
  if (t == KvType::Int8) return "int8 KV: dPPL -0.005%, KL 0.000014 nats, top-1 99.90% vs f32 (docs/KV-QUALITY.md)";
  return "int4 KV, keys per channel: dPPL +0.22%, KL 0.0044 nats, top-1 97.35% vs f32 (docs/KV-QUALITY.md)";
}

uint64_t scratch_for(const ModelShape& m, int batch_tokens) {
  return uint64_t(default_scratch_bytes(m)) * uint64_t(batch_tokens) / 512;
}

std::string sz(uint64_t b) { return format_bytes(double(b)); }

}  // namespace

KvLayout ram_budget_layout(const ModelShape& m, KvType type, int bs) {
  KvLayout l{m.n_layers, m.n_kv_heads, m.head_dim, bs};
  l.type = type;
  l.key_scale = KeyScale::Channel;
  l.group_tokens = bs;
  // Layers of different windows: the hybrid cache (blocks of S layer slots).
  if (!m.layer_window.empty()) l.groups = KvGroups::by_window(m.layer_window);
  l.validate();
  return l;
}

namespace {

// Blocks one sequence of ctx tokens needs, every KV table (a windowed one
// at its bound), plus one block of slack.
int64_t blocks_per_sequence(const KvLayout& l, int ctx, int step) {
  return sequence_block_cap(table_windows(WindowPolicy{}, l.groups), ctx, l.block_size, step) + 1;
}

// The longest sequence `blocks` blocks hold: the windowed tables at their
// bound, the rest shared by the full-attention tables.
int64_t tokens_in(const KvLayout& l, int64_t blocks, int step) {
  const std::vector<TableWindow> tw = table_windows(WindowPolicy{}, l.groups);
  int64_t full = 0, windowed = 0;
  for (const TableWindow& t : tw) {
    if (t.frees()) windowed += t.block_cap(l.block_size, step);
    else ++full;
  }
  if (full == 0) return INT32_MAX;
  return std::max<int64_t>(0, blocks - 1 - windowed) / full * l.block_size;
}

}  // namespace

int hard_cap_that_fits(const KvLayout& l, uint64_t kv_bytes, int ctx, int step) {
  auto fits = [&](int tokens) { return uint64_t(blocks_per_sequence(l, tokens, step)) * l.block_bytes() <= kv_bytes; };
  if (fits(ctx)) return ctx;
  int lo = 0, hi = ctx / l.block_size + 1;  // in blocks: lo fits (or is 0), hi does not
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (fits(mid * l.block_size) ? lo : hi) = mid;
  }
  return lo * l.block_size;
}

RamBudgetChoice choose_for_budget(const RamBudgetInput& in) {
  const ModelShape& m = in.model;
  if (in.block_size < 1 || in.want_batch < 1 || in.max_batch_tokens < 1 || in.max_tokens < 1)
    throw std::invalid_argument("ram budget: block size, batch, batch tokens and max tokens must be >= 1");
  RamBudgetChoice c;
  c.budget_bytes = in.budget_bytes;
  c.weight_bytes = m.weight_bytes;
  c.n_heads = m.n_heads;
  c.n_kv_heads = m.n_kv_heads;
  c.block_size = in.block_size;
  if (m.weight_bytes >= in.budget_bytes)
    throw std::runtime_error("--ram-budget " + sz(in.budget_bytes) + " cannot hold the weights alone (" +
                             sz(m.weight_bytes) + "); a smaller or more quantized model is needed");
  // The step's token budget shrinks before the KV does: scratch is per step.
  c.max_batch_tokens = in.max_batch_tokens;
  c.scratch_bytes = scratch_for(m, c.max_batch_tokens);
  while (m.weight_bytes + c.scratch_bytes >= in.budget_bytes && c.max_batch_tokens > 16) {
    c.max_batch_tokens /= 2;
    c.scratch_bytes = scratch_for(m, c.max_batch_tokens);
  }
  if (m.weight_bytes + c.scratch_bytes >= in.budget_bytes)
    throw std::runtime_error("--ram-budget " + sz(in.budget_bytes) + " cannot hold the weights (" +
                             sz(m.weight_bytes) + ") and the smallest step's scratch (" + sz(c.scratch_bytes) + ")");
  if (c.max_batch_tokens < in.max_batch_tokens)
    c.notes.push_back("tokens per step cut to " + std::to_string(c.max_batch_tokens) + " to fit the scratch");
  const uint64_t kv_avail = in.budget_bytes - m.weight_bytes - c.scratch_bytes;
  const int ctx = in.want_ctx > 0 ? in.want_ctx : std::max(m.n_ctx, kMinHardCap);
  const int64_t per_seq = blocks_per_sequence(ram_budget_layout(m, KvType::Int8, in.block_size), ctx,
                                              c.max_batch_tokens);
  int64_t blocks = 0;
  c.kv_type = KvType::Int4;
  for (KvType t : {KvType::Int8, KvType::Int4}) {
    blocks = int64_t(kv_avail / ram_budget_layout(m, t, in.block_size).block_bytes());
    if (blocks >= per_seq * in.want_batch || t == KvType::Int4) {
      c.kv_type = t;
      break;
    }
  }
  c.batch = int(std::min<int64_t>(in.want_batch, std::max<int64_t>(1, blocks / per_seq)));
  c.hard_cap = ctx;
  if (blocks < per_seq)
    c.hard_cap = int(std::min<int64_t>(ctx, tokens_in(ram_budget_layout(m, c.kv_type, in.block_size), blocks,
                                                      c.max_batch_tokens)));
  if (c.hard_cap < kMinHardCap)
    throw std::runtime_error("--ram-budget " + sz(in.budget_bytes) + " leaves " + sz(kv_avail) +
                             " for the KV cache after weights (" + sz(m.weight_bytes) + ") and scratch (" +
                             sz(c.scratch_bytes) + "): fewer than " + std::to_string(kMinHardCap) +
                             " tokens even in int4");
  if (c.kv_type == KvType::Int4) c.notes.push_back("int8 would not hold the full context for the batch");
  if (c.batch < in.want_batch) c.notes.push_back("sequences at once cut to " + std::to_string(c.batch));
  if (c.hard_cap < ctx) c.notes.push_back("hard cap cut to " + std::to_string(c.hard_cap) + " tokens");
  const KvLayout l = ram_budget_layout(m, c.kv_type, in.block_size);
  KvLayout mha = l;
  mha.n_kv_heads = m.n_heads;
  c.kv_blocks = blocks;
  c.kv_bytes = uint64_t(blocks) * l.block_bytes();
  c.kv_bytes_per_token = l.bytes_per_token_avg();
  c.mha_bytes_per_token = mha.bytes_per_token_avg();
  c.window = c.hard_cap / 2;
  c.max_tokens = std::max(1, std::min(in.max_tokens, c.hard_cap / 4));
  c.quality = quality_of(c.kv_type);
  return c;
}

std::string RamBudgetChoice::describe() const {
  std::string s = "ram budget " + sz(budget_bytes) + ": weights " + sz(weight_bytes) + " + scratch " +
                  sz(scratch_bytes) + " + KV " + sz(kv_bytes) + " (" + std::to_string(kv_blocks) + " blocks of " +
                  std::to_string(block_size) + " tokens)\n";
  s += "  KV " + std::string(to_string(kv_type)) + " keys/channel, " + format_int(int64_t(kv_bytes_per_token + 0.5)) +
       " B/token; " + std::to_string(n_kv_heads) + " KV heads for " + std::to_string(n_heads) +
       " query heads (as MHA: " + format_int(int64_t(mha_bytes_per_token + 0.5)) + " B/token)\n";
  s += "  hard cap " + std::to_string(hard_cap) + " tokens, window " + std::to_string(window) + ", max tokens " +
       std::to_string(max_tokens) + ", " + std::to_string(batch) + " sequence(s) at once, " +
       std::to_string(max_batch_tokens) + " tokens per step\n";
  s += "  quality price: " + quality;
  for (const auto& n : notes) s += "\n  note: " + n;
  return s;
}

}  // namespace kvs::tools
