// `kvserve bench`: llama-bench style prefill (pp) and decode (tg) speed,
// repeated, mean ± sd, with the bytes each decoded token must read.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/local_sequence.h"

namespace kvs::cli {

namespace {
struct BenchArgs {
  ModelArgs m;
  int p = 128, n = 64, reps = 5, depth = 0;
  bool json = false;
  KvArgs kv;
};

struct Stat {
  double mean = 0, sd = 0;
};
Stat stat(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / (v.size() - 1)) : 0;
  return s;
}

int run_bench(const BenchArgs& a) {
  using clock = std::chrono::steady_clock;
  Loaded l = load_all(a.m);
  const ModelConfig& c = l.model->config();
  LocalSequence seq(*l.engine, std::max(a.p, a.depth + a.n) + 1, 16, a.kv.options());
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> tok(3, c.n_vocab - 1);
  std::vector<int32_t> prompt(a.p);
  std::vector<int32_t> ctx_prompt(static_cast<size_t>(a.depth));
  for (auto& t : ctx_prompt) t = tok(rng);
  bool at_depth = false;  // the depth prefix is in the cache
  for (auto& t : prompt) t = tok(rng);
  std::vector<double> pp, tg;
  // One warm-up of each, then the measured repetitions.
  for (int rep = -1; rep < a.reps; ++rep) {
    if (a.p > 0) {
      seq.reset();
      at_depth = false;
      auto t0 = clock::now();
      seq.eval(prompt.data(), a.p);
      double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (rep >= 0) pp.push_back(a.p / s);
    }
    if (a.n > 0) {
      // Decode after `depth` tokens of context (prefilled once, untimed;
      // each repetition goes back to it).
      if (a.depth > 0 && at_depth) {
        seq.truncate(a.depth);
      } else {
        seq.reset();
        if (a.depth > 0) {
          seq.eval(ctx_prompt.data(), a.depth, false, 512);
          at_depth = true;
        }
      }
      int32_t t = 1;
      auto t0 = clock::now();
      for (int i = 0; i < a.n; ++i) {
        seq.eval(&t, 1);
        t = tok(rng);
      }
      double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (rep >= 0) tg.push_back(a.n / s);
    }
    std::fprintf(stderr, "\rbench: repetition %d/%d", rep + 1, a.reps);
  }
  std::fprintf(stderr, "\n");
  // Bytes a decode step must read: every weight except the embedding table
  // (one row) plus, on average, half the KV of the run.
  const double embd = double(l.model->weights().tok_embd.row_stride) * c.n_vocab;
  const bool tied = c.tied_output;
  const double w_bytes = double(c.weight_bytes) - (tied ? 0 : embd);
  const double kv_tok = seq.layout().bytes_per_token_avg();
  const double bytes_per_token = w_bytes + kv_tok * (a.depth + a.n / 2.0);
  Stat sp = pp.empty() ? Stat{} : stat(pp), st = tg.empty() ? Stat{} : stat(tg);
  if (a.json) {
    nlohmann::json j{{"model", l.model->path()}, {"threads", l.engine->n_threads()},
                     {"pp", a.p}, {"tg", a.n}, {"depth", a.depth}, {"reps", a.reps},
                     {"kv", seq.layout().describe()},
                     {"pp_tokens_per_s", sp.mean}, {"pp_sd", sp.sd},
                     {"tg_tokens_per_s", st.mean}, {"tg_sd", st.sd},
                     {"decode_bytes_per_token", bytes_per_token},
                     {"decode_gb_per_s", st.mean * bytes_per_token / 1e9}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("| model | threads | test | tok/s | GB/s read |\n|---|---|---|---|---|\n");
    if (a.p > 0)
      std::printf("| %s | %d | pp%d | %.2f ± %.2f | |\n", c.name.c_str(), l.engine->n_threads(), a.p, sp.mean, sp.sd);
    if (a.n > 0)
      std::printf("| %s | %d | tg%d%s | %.2f ± %.2f | %.1f |\n", c.name.c_str(), l.engine->n_threads(), a.n,
                  a.depth > 0 ? (" @ d" + std::to_string(a.depth) + " " + seq.layout().describe()).c_str() : "", st.mean,
                  st.sd, st.mean * bytes_per_token / 1e9);
  }
  return 0;
}
}  // namespace

void add_bench(CLI::App& app, Runner& run) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* c = app.add_subcommand("bench", "Prefill and decode speed (llama-bench style)");
  add_model_args(c, a->m);
  c->add_option("-p,--n-prompt", a->p, "Prompt tokens for the prefill test (0 = skip)")->capture_default_str();
  c->add_option("-n,--n-gen", a->n, "Tokens for the decode test (0 = skip)")->capture_default_str();
  c->add_option("-r,--reps", a->reps, "Repetitions")->capture_default_str()->check(CLI::Range(1, 1000));
  c->add_option("-d,--depth", a->depth, "Decode test after this many tokens of context (llama-bench -d)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  c->add_flag("--json", a->json, "Print one JSON object");
  add_kv_args(c, a->kv);
  c->callback([a, &run] { run = [a] { return run_bench(*a); }; });
}

}  // namespace kvs::cli
