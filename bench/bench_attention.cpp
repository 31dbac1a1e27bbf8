// Attention micro-benchmarks, one thread, one layer, each --kv-type:
//   attention/<type>/<ctx>  decode: one query token over a paged cache of
//       `ctx` tokens (32 query heads, 4 kv heads, head_dim 64), every kv-head
//       group; the cache is spread over >= 256 MiB so calls stream it from
//       DRAM, as a real decode step does.
//   prefill/<type>/<ctx>    a causal prompt of `ctx` tokens at the 1.1B
//       bench model's shape (32 heads, 8 kv heads, head_dim 64): every query
//       block (64 tokens; one token group of 16 for int8/int4) and kv group,
//       head by head, as the engine runs them.
//   *_bf16/f16/<ctx>        the same with AttnShape::bf16 (the AMX-BF16
//       tiles; skipped where they are missing)
// Counters:
//   GFLOP/s   4 * n_heads * head_dim per (query, visible key) (QK^T and PV)
//   KV_GB/s   decode: bytes of K and V the call reads (the layer's cache)
// Run: build/bench_attention --benchmark_filter='prefill/f32'
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu.h"
#include "kernels/kv_codec.h"
#include "kv/block_storage.h"

namespace {

using namespace kvs;

constexpr int kHeads = 32, kKvHeads = 4, kHeadDim = 64, kBlock = 16;

struct Case {
  KvType type;
  KeyScale ks;
  const char* name;
};
const Case kCases[] = {{KvType::F32, KeyScale::Channel, "f32"},     {KvType::F16, KeyScale::Channel, "f16"},
                       {KvType::BF16, KeyScale::Channel, "bf16"},   {KvType::Int8, KeyScale::Channel, "int8"},
                       {KvType::Int4, KeyScale::Channel, "int4"},   {KvType::Int4, KeyScale::Token, "int4_token"}};

// Scratch floats for `rows` query rows.
size_t scratch_floats(int rows, int ctx, int head_dim, bool bf16) {
  (void)ctx;  // the tiled kernel keeps no score rows
  return attention_scratch_floats(rows, head_dim, bf16);
}

bool skip_bf16(benchmark::State& st, bool bf16) {
  if (!bf16 || amx_bf16_active()) return false;
  st.SkipWithError("no AMX-BF16 here: the bf16 attention cannot run");
  return true;
}

void BM_attention(benchmark::State& st, Case c, bool bf16) {
  if (skip_bf16(st, bf16)) return;
  const int ctx = int(st.range(0));
  KvLayout L{1, kKvHeads, kHeadDim, kBlock};
  L.type = c.type;
  L.key_scale = c.ks;
  L.group_tokens = kBlock;
  const int blocks_per_seq = (ctx + kBlock - 1) / kBlock;
  const size_t seq_bytes = size_t(blocks_per_seq) * L.block_bytes();
  const int copies = int(std::max<size_t>(1, (256u << 20) / seq_bytes));
  BlockStorage storage(L, int64_t(blocks_per_seq) * copies);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t row = L.row_floats();
  std::vector<float> k(size_t(kBlock) * row), v(k.size());
  for (int64_t b = 0; b < storage.n_blocks(); ++b) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    if (L.quantized()) kvc::store_group(storage.view(), int32_t(b), 0, 0, k.data(), v.data());
    else kvc::store_rows(storage.view(), int32_t(b), 0, 0, kBlock, k.data(), v.data());
  }
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(copies),
                                          std::vector<int32_t>(static_cast<size_t>(blocks_per_seq)));
  for (int cp = 0; cp < copies; ++cp)
    for (int i = 0; i < blocks_per_seq; ++i) tables[size_t(cp)][size_t(i)] = cp * blocks_per_seq + i;
  std::vector<float> q(size_t(kHeads) * kHeadDim), out(q.size());
  for (auto& x : q) x = nd(rng);
  const int r = kHeads / kKvHeads;
  std::vector<float> scratch(scratch_floats(r, ctx, kHeadDim, bf16));
  AttnShape shape{kHeads, kKvHeads, kHeadDim, 1.0f / std::sqrt(float(kHeadDim))};
  shape.bf16 = bf16;
  int cp = 0;
  for (auto _ : st) {
    AttnSeq as{tables[size_t(cp)].data(), ctx, ctx, nullptr, nullptr};
    for (int g = 0; g < kKvHeads; ++g) attention_group(q.data(), storage.view(), 0, as, g, shape, out.data(), scratch.data());
    benchmark::DoNotOptimize(out.data());
    cp = (cp + 1) % copies;
  }
  const double calls = double(st.iterations());
  st.counters["GFLOP/s"] =
      benchmark::Counter(calls * 4.0 * kHeads * kHeadDim * ctx / 1e9, benchmark::Counter::kIsRate);
  st.counters["KV_GB/s"] =
      benchmark::Counter(calls * double(L.block_bytes()) * ctx / kBlock / 1e9, benchmark::Counter::kIsRate);
}

void BM_prefill(benchmark::State& st, Case c, bool bf16) {
  if (skip_bf16(st, bf16)) return;
  constexpr int kH = 32, kKv = 8;
  const int ctx = int(st.range(0));
  KvLayout L{1, kKv, kHeadDim, kBlock};
  L.type = c.type;
  L.key_scale = c.ks;
  L.group_tokens = kBlock;
  const int kT = L.quantized() ? L.group_tokens : 64;  // the engine's query blocks (batch_plan.cpp)
  const int blocks = (ctx + kBlock - 1) / kBlock;
  BlockStorage storage(L, blocks);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t row = L.row_floats(), qdim = size_t(kH) * kHeadDim;
  std::vector<float> k(size_t(blocks) * kBlock * row), v(k.size()), q(size_t(ctx) * qdim), out(q.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  for (int b = 0; b < blocks; ++b) {
    const size_t o = size_t(b) * kBlock * row;
    if (L.quantized()) kvc::store_group(storage.view(), b, 0, 0, &k[o], &v[o]);
    else kvc::store_rows(storage.view(), b, 0, 0, kBlock, &k[o], &v[o]);
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int b = 0; b < blocks; ++b) table[size_t(b)] = b;
  std::vector<float> scratch(scratch_floats(kH / kKv * kT, ctx, kHeadDim, bf16));
  AttnShape shape{kH, kKv, kHeadDim, 1.0f / std::sqrt(float(kHeadDim))};
  shape.bf16 = bf16;
  for (auto _ : st) {
    // Head-major, as the engine hands out its tasks: one head's keys stay in cache.
    for (int g = 0; g < kKv; ++g)
      for (int t0 = 0; t0 < ctx; t0 += kT) {
        const int T = std::min(kT, ctx - t0), n = t0 + T;
        // A quantized cache: the block's own group is read from float rows.
        const int ns = L.quantized() ? t0 : n;
        const AttnSeq as{table.data(), n, ns, &k[size_t(ns) * row], &v[size_t(ns) * row]};
        attention_group_block(&q[size_t(t0) * qdim], qdim, T, storage.view(), 0, as, g, shape, &out[size_t(t0) * qdim],
                              qdim, scratch.data());
      }
    benchmark::DoNotOptimize(out.data());
  }
  const double pairs = double(ctx) * (ctx + 1) / 2;
  st.counters["GFLOP/s"] =
      benchmark::Counter(double(st.iterations()) * 4.0 * kH * kHeadDim * pairs / 1e9, benchmark::Counter::kIsRate);
}

const bool registered = [] {
  for (const bool bf16 : {false, true})
    for (const Case& c : kCases) {
      if (bf16 && c.type != KvType::F16) continue;
      const std::string sfx = std::string(bf16 ? "_bf16/" : "/") + c.name;
      benchmark::RegisterBenchmark(("attention" + sfx).c_str(), BM_attention, c, bf16)
          ->Arg(512)
          ->Arg(4096)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("prefill" + sfx).c_str(), BM_prefill, c, bf16)
          ->Arg(512)
          ->Arg(2048)
          ->Unit(benchmark::kMillisecond);
    }
  return true;
}();

}  // namespace
