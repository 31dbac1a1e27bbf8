// Exact integer KV sizing; see capacity.h for the model of what a block and a
// request cost. Every product is overflow-checked because the inputs come
// from the command line and from untrusted model metadata.
#include "kv/capacity.h"

#include <algorithm>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "kernels/kv_groups.h"
#include "kv/window_policy.h"

namespace kvs {
namespace {

uint64_t mul_checked(uint64_t a, uint64_t b, const char* what) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw std::overflow_error(std::string("kv capacity: ") + what + " overflows 64 bits");
  return r;
}

uint64_t add_checked(uint64_t a, uint64_t b, const char* what) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    throw std::overflow_error(std::string("kv capacity: ") + what + " overflows 64 bits");
  return r;
}

// "13477363712 B (12.55 GiB)": exact for scripts, readable for people.
std::string bytes_str(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%llu B (%.2f GiB)", static_cast<unsigned long long>(b), double(b) / (1ull << 30));
  return buf;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

int KvFormat::bits_per_element() const {
  switch (dtype) {
    case KvDtype::F32: return 32;
    case KvDtype::F16:
    case KvDtype::BF16: return 16;
    case KvDtype::Int8: return 8;
    case KvDtype::Int4: return 4;
  }
  throw std::invalid_argument("KvFormat: unknown dtype");
}

int KvFormat::metadata_bytes_per_group() const {
  switch (dtype) {
    case KvDtype::Int8: return 2;  // fp16 scale
    case KvDtype::Int4: return 4;  // fp16 scale + fp16 min
    default: return 0;
  }
}

size_t KvFormat::row_bytes(int64_t n) const {
  if (n < 1) throw std::invalid_argument("KvFormat::row_bytes: row length must be >= 1, got " + std::to_string(n));
  const uint64_t un = uint64_t(n);
  // Payload: round a trailing half byte (odd int4 rows) up to a whole byte.
  const uint64_t payload = (mul_checked(un, uint64_t(bits_per_element()), "row payload") + 7) / 8;
  if (!quantized()) return payload;
  if (group_size < 1)
    throw std::invalid_argument("KvFormat: group size must be >= 1 for " + name());
  const uint64_t groups = (un + uint64_t(group_size) - 1) / uint64_t(group_size);
  return add_checked(payload, mul_checked(groups, uint64_t(metadata_bytes_per_group()), "row metadata"),
                     "row bytes");
}

std::string KvFormat::name() const {
  switch (dtype) {
    case KvDtype::F32: return "f32";
    case KvDtype::F16: return "f16";
    case KvDtype::BF16: return "bf16";
    case KvDtype::Int8: return "int8/g" + std::to_string(group_size);
    case KvDtype::Int4: return "int4/g" + std::to_string(group_size);
  }
  return "?";
}

KvFormat parse_kv_format(const std::string& s_in) {
  const std::string s = lower(s_in);
  std::string base = s, group;
  for (const char* sep : {"/g", ":"}) {
    const size_t p = s.find(sep);
    if (p != std::string::npos) {
      base = s.substr(0, p);
      group = s.substr(p + std::string(sep).size());
      break;
    }
  }
  const auto bad = [&]() {
    return std::invalid_argument("unknown KV cache type '" + s_in +
                                 "': expected f32, f16, bf16, int8 or int4 (quantized types may "
                                 "add a group size, e.g. int8/g64 or int4:128)");
  };
  KvFormat f;
  if (base == "f32" || base == "fp32") f = KvFormat::f32();
  else if (base == "f16" || base == "fp16") f = KvFormat::f16();
  else if (base == "bf16") f = KvFormat::bf16();
  else if (base == "int8" || base == "q8") f = KvFormat::int8();
  else if (base == "int4" || base == "q4") f = KvFormat::int4();
  else throw bad();
  if (!group.empty() || s != base) {
    if (!f.quantized())
      throw std::invalid_argument("KV cache type '" + s_in + "': only int8/int4 take a group size");
    if (group.empty() || group.size() > 6) throw bad();
    for (char c : group)
      if (!std::isdigit(static_cast<unsigned char>(c))) throw bad();
    f.group_size = std::stoi(group);
    if (f.group_size < 1) throw std::invalid_argument("KV cache type '" + s_in + "': group size must be >= 1");
  }
  return f;
}

std::vector<KvFormat> standard_kv_formats() {
  return {KvFormat::f32(), KvFormat::f16(), KvFormat::bf16(), KvFormat::int8(), KvFormat::int4()};
}

size_t kv_bytes_per_token(int n_layers, int n_kv_heads, int head_dim, KvFormat fmt) {
  if (n_layers < 1 || n_kv_heads < 1 || head_dim < 1)
    throw std::invalid_argument("kv_bytes_per_token: layers, kv_heads and head_dim must be >= 1 (got " +
                                std::to_string(n_layers) + ", " + std::to_string(n_kv_heads) + ", " +
                                std::to_string(head_dim) + ")");
  const uint64_t rows = mul_checked(2ull * uint64_t(n_layers), uint64_t(n_kv_heads), "kv rows");
  return mul_checked(rows, fmt.row_bytes(head_dim), "kv bytes per token");
}

int64_t blocks_for_tokens(int64_t tokens, int block_size) {
  if (block_size < 1)
    throw std::invalid_argument("block size must be >= 1, got " + std::to_string(block_size));
  if (tokens < 0) throw std::invalid_argument("token count must be >= 0, got " + std::to_string(tokens));
  return tokens / block_size + (tokens % block_size != 0 ? 1 : 0);
}

int64_t request_blocks(int64_t prompt_tokens, int64_t max_tokens, int block_size,
                       int64_t cached_prefix_blocks) {
  if (prompt_tokens < 0 || max_tokens < 0)
    throw std::invalid_argument("request_blocks: prompt and max_tokens must be >= 0 (got " +
                                std::to_string(prompt_tokens) + ", " + std::to_string(max_tokens) + ")");
  int64_t total = 0;
  if (__builtin_add_overflow(prompt_tokens, max_tokens, &total))
    throw std::overflow_error("request_blocks: prompt + max_tokens overflows");
  const int64_t blocks = blocks_for_tokens(total, block_size);
  const int64_t shareable = prompt_tokens / block_size;  // only full prompt blocks are shared
  if (cached_prefix_blocks < 0 || cached_prefix_blocks > shareable)
    throw std::invalid_argument("request_blocks: " + std::to_string(cached_prefix_blocks) +
                                " cached prefix blocks, but a " + std::to_string(prompt_tokens) +
                                "-token prompt has only " + std::to_string(shareable) + " full blocks of " +
                                std::to_string(block_size));
  return blocks - cached_prefix_blocks;
}

int64_t headroom_blocks(int64_t total_blocks, double headroom_fraction) {
  if (!(headroom_fraction >= 0.0 && headroom_fraction < 1.0))
    throw std::invalid_argument("headroom fraction must be in [0, 1), got " + std::to_string(headroom_fraction));
  if (total_blocks < 0) throw std::invalid_argument("total blocks must be >= 0");
  const int64_t ppm = std::llround(headroom_fraction * 1e6);
  // ceil(total × ppm / 1e6) in 128-bit so huge pools cannot overflow.
  const __int128 num = __int128(total_blocks) * ppm;
  return int64_t((num + 999'999) / 1'000'000);
}

std::vector<KvTableShape> kv_table_shapes(const std::vector<int>& layer_window, int n_layers) {
  const KvGroups g = layer_window.empty() ? KvGroups::uniform(n_layers) : KvGroups::by_window(layer_window);
  std::vector<KvTableShape> out;
  for (const KvGroups::Table& t : g.tables) out.push_back({g.slots, t.window});
  return out;
}

int64_t table_blocks(const KvTableShape& t, int64_t tokens, int block_size, int max_step_tokens) {
  const int64_t all = blocks_for_tokens(tokens, block_size);
  if (t.window <= 0) return all;
  const int64_t bound = max_step_tokens > 0
                            ? window_block_cap(WindowPolicy::native(t.window), block_size, max_step_tokens)
                            : blocks_for_tokens(t.window, block_size) + 1;
  return std::min(all, bound);
}

uint64_t sequence_kv_bytes(const std::vector<KvTableShape>& tables, int64_t tokens, int block_size,
                           uint64_t layer_token_bytes, int max_step_tokens) {
  uint64_t sum = 0;
  for (const KvTableShape& t : tables) {
    const uint64_t per_block =
        mul_checked(mul_checked(uint64_t(t.slots), uint64_t(block_size), "table block"), layer_token_bytes, "table block");
    sum = add_checked(sum, mul_checked(uint64_t(table_blocks(t, tokens, block_size, max_step_tokens)), per_block,
                                       "table bytes"),
                      "sequence bytes");
  }
  return sum;
}

// Per table, a request's blocks bounded by the table's window, summed; and
// the longest single sequence the usable blocks hold (-1: unbounded).
static void per_table_requests(const CapacityInput& in, CapacityResult& r) {
  const int64_t one = request_blocks(in.prompt_tokens, in.max_tokens, in.block_size, in.cached_prefix_blocks);
  int64_t sum = 0, windowed = 0, full = 0;
  for (const KvTableShape& t : in.tables) {
    if (t.window <= 0) {
      sum += one;
      ++full;
      continue;
    }
    const int64_t cap = table_blocks(t, INT64_MAX / 2, in.block_size, in.max_step_tokens);
    sum += std::min(one, cap);
    windowed += cap;
  }
  r.blocks_per_request = sum;
  r.max_tokens_resident = full > 0 ? std::max<int64_t>(0, r.usable_blocks - windowed) / full * in.block_size : -1;
}

CapacityResult estimate_capacity(const CapacityInput& in) {
  if (in.kv_bytes_per_token == 0) throw std::invalid_argument("estimate_capacity: kv_bytes_per_token is 0");
  if (in.block_size < 1)
    throw std::invalid_argument("estimate_capacity: block size must be >= 1, got " + std::to_string(in.block_size));
  if (!in.tables.empty() && (in.layer_token_bytes == 0 || in.tables[0].slots < 1))
    throw std::invalid_argument("estimate_capacity: KV tables need their layer slots and bytes per layer-token");
  CapacityResult r;
  r.bytes_per_block =
      in.tables.empty()
          ? mul_checked(uint64_t(in.block_size), in.kv_bytes_per_token, "bytes per block")
          : mul_checked(mul_checked(uint64_t(in.block_size), uint64_t(in.tables[0].slots), "bytes per block"),
                        in.layer_token_bytes, "bytes per block");
  const uint64_t fixed = add_checked(in.weight_bytes, in.scratch_bytes, "weights + scratch");
  if (in.mem_budget_bytes <= fixed)
    throw std::invalid_argument("memory budget of " + bytes_str(in.mem_budget_bytes) + " cannot hold the weights, " +
                                bytes_str(in.weight_bytes) + ", plus scratch, " + bytes_str(in.scratch_bytes) +
                                ": no room is left for the KV cache");
  r.kv_budget_bytes = in.mem_budget_bytes - fixed;
  const uint64_t blocks = r.kv_budget_bytes / r.bytes_per_block;
  if (blocks > uint64_t(std::numeric_limits<int64_t>::max()))
    throw std::overflow_error("estimate_capacity: block count overflows");
  r.total_blocks = int64_t(blocks);
  r.headroom_blocks = headroom_blocks(r.total_blocks, in.headroom_fraction);
  r.usable_blocks = r.total_blocks - r.headroom_blocks;
  r.blocks_per_request = request_blocks(in.prompt_tokens, in.max_tokens, in.block_size, in.cached_prefix_blocks);
  int64_t toks = 0;
  if (__builtin_mul_overflow(r.usable_blocks, int64_t(in.block_size), &toks))
    throw std::overflow_error("estimate_capacity: resident token count overflows");
  r.max_tokens_resident = toks;
  if (!in.tables.empty()) per_table_requests(in, r);
  // A request that needs no new block (fully cached, nothing to generate)
  // is not limited by the cache; report the number of blocks instead of ∞.
  r.max_concurrent_sequences =
      r.blocks_per_request > 0 ? r.usable_blocks / r.blocks_per_request : r.usable_blocks;
  return r;
}

}  // namespace kvs
