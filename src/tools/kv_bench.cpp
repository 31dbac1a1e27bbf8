#include "tools/kv_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include "engine/local_sequence.h"
#include "engine/paged_engine.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tools/progress.h"

namespace kvs::tools {
namespace {

using clock_t_ = std::chrono::steady_clock;
double seconds_since(clock_t_::time_point t0) { return std::chrono::duration<double>(clock_t_::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int n_vocab) {
  std::uniform_int_distribution<int> d(3, n_vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

// Contiguous: LocalSequence's private blocks 0, 1, 2, ...
double decode_contiguous(Engine& e, const KvBenchOptions& o, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& gen) {
  LocalSequence seq(e, o.n_prompt + o.n_gen + 1, o.block_size);
  seq.eval(prompt);
  const auto t0 = clock_t_::now();
  for (int i = 0; i < o.n_gen; ++i) seq.eval(&gen[size_t(i)], 1);
  return o.n_gen / seconds_since(t0);
}

// Paged: the sequence's blocks are every other block of a pool, in
// descending order (what a long-running server's free list looks like).
double decode_paged(Engine& e, const KvBenchOptions& o, const std::vector<int32_t>& prompt,
                    const std::vector<int32_t>& gen) {
  const int ctx = o.n_prompt + o.n_gen + 1;
  const int64_t need = (ctx + o.block_size - 1) / o.block_size;
  PagedEngineOptions po;
  po.block_size = o.block_size;
  po.n_blocks = 2 * need + 2;
  po.max_ctx = ctx;
  po.prefix_caching = false;
  PagedEngine pe(e, po);
  // Fill the pool with one-block sequences, then free every other one.
  std::vector<SeqId> fill;
  const std::vector<int32_t> one(size_t(o.block_size), 5);
  std::vector<SeqStep> items;
  for (int64_t i = 0; i < po.n_blocks; ++i) {
    fill.push_back(pe.add(std::span<const int32_t>(one.data(), 1)).seq);
    items.push_back({fill.back(), std::span<const int32_t>(one.data(), 1)});
  }
  if (!pe.step(items).ok) throw std::logic_error("kv-bench: filling the pool failed");
  for (size_t i = 1; i < fill.size(); i += 2) pe.release(fill[i]);
  auto a = pe.add(prompt);
  if (!pe.step({{a.seq, prompt}}).ok) throw std::logic_error("kv-bench: prefill did not fit");
  StepResult out;
  std::vector<SeqStep> item(1);
  const auto t0 = clock_t_::now();
  for (int i = 0; i < o.n_gen; ++i) {
    item[0] = {a.seq, std::span<const int32_t>(&gen[size_t(i)], 1)};
    pe.step(item, out);
    if (!out.ok) throw std::logic_error("kv-bench: decode did not fit");
  }
  return o.n_gen / seconds_since(t0);
}

}  // namespace

KvBenchResult run_kv_bench(Engine& e, const KvBenchOptions& o) {
  if (o.n_prompt < 1 || o.n_gen < 1 || o.system_tokens < 1 || o.user_tokens < 1 || o.reps < 1)
    throw std::invalid_argument("kv-bench: token counts and repetitions must be >= 1");
  const int nv = e.model().config().n_vocab;
  std::mt19937 rng(uint32_t(o.seed));
  KvBenchResult r;

  // --- decode: contiguous vs paged ---
  const auto prompt = random_tokens(rng, o.n_prompt, nv), gen = random_tokens(rng, o.n_gen, nv);
  std::vector<double> cont, paged;
  decode_contiguous(e, o, prompt, gen);  // warm-up (page in weights)
  Progress decode_bar("kv-bench decode", o.reps);  // draws only on a terminal
  for (int i = 0; i < o.reps; ++i) {
    if (i % 2 == 0) {  // alternate the order: neither side always runs on a warmer or quieter machine
      cont.push_back(decode_contiguous(e, o, prompt, gen));
      paged.push_back(decode_paged(e, o, prompt, gen));
    } else {
      paged.push_back(decode_paged(e, o, prompt, gen));
      cont.push_back(decode_contiguous(e, o, prompt, gen));
    }
    decode_bar.update(i + 1);
  }
  decode_bar.finish();
  r.contiguous_tok_s = median(cont);
  r.paged_tok_s = median(paged);
  r.paged_vs_contiguous = r.paged_tok_s / r.contiguous_tok_s;

  // --- time to first token: cached system prompt vs cold ---
  const int len = o.system_tokens + o.user_tokens;
  PagedEngineOptions po;
  po.block_size = o.block_size;
  po.max_ctx = len;
  po.n_blocks = 2 * ((len + o.block_size - 1) / o.block_size) + 2;
  PagedEngine pe(e, po);
  const auto system = random_tokens(rng, o.system_tokens, nv);
  auto request = [&](bool cold) {
    std::vector<int32_t> p = system;
    const auto user = random_tokens(rng, o.user_tokens, nv);
    p.insert(p.end(), user.begin(), user.end());
    if (cold) pe.drop_cached();
    const int64_t before = pe.stats().forward_tokens;
    const auto t0 = clock_t_::now();
    auto a = pe.add(p);
    StepResult s = pe.step({{a.seq, uncached_tail(p, a)}});
    if (!s.ok) throw std::logic_error("kv-bench: request did not fit");
    (void)argmax(s.logits_of(0), s.n_vocab);  // the first token
    const double ms = 1e3 * seconds_since(t0);
    pe.release(a.seq);
    if (cold) r.cold_forward_tokens = pe.stats().forward_tokens - before;
    else {
      r.cached_forward_tokens = pe.stats().forward_tokens - before;
      r.cached_tokens = a.cached_tokens;
    }
    return ms;
  };
  std::vector<double> cold, warm;
  request(true);  // warm-up; every cold request leaves the system prompt cached
  Progress ttft_bar("kv-bench TTFT", o.reps);
  for (int i = 0; i < o.reps; ++i) {
    cold.push_back(request(true));
    warm.push_back(request(false));
    ttft_bar.update(i + 1);
  }
  ttft_bar.finish();
  r.ttft_cold_ms = median(cold);
  r.ttft_cached_ms = median(warm);
  return r;
}

std::string kv_bench_table(const Engine& e, const KvBenchOptions& o, const KvBenchResult& r) {
  const ModelConfig& c = e.model().config();
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "model %s, %d threads, block size %d\n\n"
                "| decode (context %d, %d tokens) | tok/s (median of %d) |\n|---|---|\n"
                "| contiguous (LocalSequence) | %.2f |\n| paged, scattered blocks (PagedEngine) | %.2f |\n"
                "| paged / contiguous | %.3f |\n\n"
                "| TTFT, %d-token system prompt + %d new tokens | ms (median of %d) | tokens through the model |\n"
                "|---|---|---|\n| cold cache | %.2f | %lld |\n| system prompt cached | %.2f | %lld |\n"
                "| speed-up | %.1fx | |\n",
                c.name.c_str(), e.n_threads(), o.block_size, o.n_prompt, o.n_gen, o.reps,
                r.contiguous_tok_s, r.paged_tok_s, r.paged_vs_contiguous, o.system_tokens, o.user_tokens, o.reps,
                r.ttft_cold_ms, (long long)r.cold_forward_tokens, r.ttft_cached_ms,
                (long long)r.cached_forward_tokens, r.ttft_cold_ms / r.ttft_cached_ms);
  return buf;
}

}  // namespace kvs::tools
