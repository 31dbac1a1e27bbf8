// `kvserve probe`: the engine's decode attention kernel timed on a paged f32
// cache, so `plan` can price the attention term of a step with a measured
// rate instead of the FP32 FMA peak (attention runs far below it: it is
// exp/max/reduction work over scattered block tiles, not a long FMA chain).
#include <chrono>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kv_codec.h"
#include "kernels/threadpool.h"
#include "kv/block_storage.h"
#include "tools/probe.h"

namespace kvs::tools {

AttentionRate measure_attention(int ctx, int threads, double seconds) {
  if (ctx < 16 || threads < 1) throw std::invalid_argument("attention probe: ctx >= 16 and threads >= 1 required");
  // The 1.1B bench shape: 32 query heads, 8 kv heads of 64, blocks of 16.
  constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 64, kBlock = 16;
  KvLayout layout{1, kKvHeads, kHeadDim, kBlock};
  const int blocks = (ctx + kBlock - 1) / kBlock;
  // One sequence per concurrent token; several copies so the cache streams
  // from memory as a batch's different sequences do (>= 64 MiB in all).
  const size_t seq_bytes = size_t(blocks) * layout.block_bytes();
  const int seqs = std::max(4 * threads, int((size_t(64) << 20) / seq_bytes) + 1);
  BlockStorage storage(layout, int64_t(blocks) * seqs);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k(size_t(kBlock) * layout.row_floats()), v(k.size());  // [block, kv_heads * head_dim]
  for (int64_t b = 0; b < storage.n_blocks(); ++b) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    kvc::store_rows(storage.view(), int32_t(b), 0, 0, kBlock, k.data(), v.data());
  }
  std::vector<int32_t> tables(size_t(blocks) * seqs);  // [seqs, blocks]
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(i);
  std::vector<float> q(size_t(kHeads) * kHeadDim), out(size_t(seqs) * kHeads * kHeadDim);  // [seqs, heads, hd]
  for (auto& x : q) x = nd(rng);
  const AttnShape shape{kHeads, kKvHeads, kHeadDim, 1.0f / std::sqrt(float(kHeadDim))};
  const int r = kHeads / kKvHeads;
  std::vector<std::vector<float>> scratch(size_t(threads),
                                          std::vector<float>(attention_scratch_floats(r, kHeadDim)));
  ThreadPool pool(threads);
  // One "step": every sequence's token, every kv-head group, spread over
  // the pool as the engine spreads (token, group) tasks.
  auto step = [&] {
    pool.parallel_for(int64_t(seqs) * kKvHeads, [&](int64_t task, int worker) {
      const int s = int(task / kKvHeads), g = int(task % kKvHeads);
      AttnSeq as{tables.data() + size_t(s) * blocks, ctx, ctx, nullptr, nullptr};
      attention_group(q.data(), storage.view(), 0, as, g, shape, out.data() + size_t(s) * kHeads * kHeadDim,
                      scratch[size_t(worker)].data());
    });
  };
  step();  // warm-up
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  int64_t steps = 0;
  double elapsed = 0;
  do {
    step();
    ++steps;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  } while (elapsed < seconds);
  AttentionRate a;
  a.ctx = ctx;
  a.threads = threads;
  a.ops_per_s = double(steps) * seqs * 4.0 * kHeads * kHeadDim * ctx / elapsed;
  return a;
}

}  // namespace kvs::tools
