// `kvserve kv-sim`: KV memory waste and concurrency of paged allocation vs
// contiguous reservations under a mixed-length workload (no model).
// `kvserve kv-bench`: decode speed through paged vs contiguous block tables,
// and time to first token with a cached vs cold system prompt (a model).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/paged_engine.h"
#include "tools/kv_bench.h"
#include "tools/kv_memory.h"
#include "tools/kv_sim.h"

namespace kvs::cli {

namespace {

struct SimArgs {
  tools::KvSimConfig c;
  std::string kv_memory;
  uint64_t bytes_per_token = 0;
  bool json = false;
};

int run_sim(SimArgs a) {
  if (!a.kv_memory.empty()) {
    if (a.bytes_per_token == 0) throw std::invalid_argument("--kv-memory needs --bytes-per-token (KV bytes of one token)");
    a.c.budget_tokens = int64_t(tools::parse_kv_memory(a.kv_memory) / a.bytes_per_token);
  }
  const auto rs = tools::run_kv_sim_all(a.c);
  if (!a.json) {
    std::printf("%s", tools::kv_sim_table(a.c, rs).c_str());
    return 0;
  }
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rs)
    j.push_back({{"policy", tools::to_string(r.policy)}, {"budget_tokens", a.c.budget_tokens},
                 {"block_size", a.c.block_size}, {"mean_running", r.mean_running},
                 {"mean_allocated", r.mean_allocated}, {"mean_tokens", r.mean_tokens},
                 {"waste_fraction", r.waste_fraction}, {"max_waste_fraction", r.max_waste_fraction},
                 {"utilization", r.utilization}, {"preemptions", r.preemptions}, {"steps", r.steps},
                 {"completed", r.completed}});
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

struct BenchArgs {
  ModelArgs m;
  tools::KvBenchOptions o;
  bool json = false;
};

int run_kv_bench_cmd(const BenchArgs& a) {
  check_block_size_option(a.o.block_size);
  Loaded l = load_all(a.m);
  const tools::KvBenchResult r = tools::run_kv_bench(*l.engine, a.o);
  if (!a.json) {
    std::printf("%s", tools::kv_bench_table(*l.engine, a.o, r).c_str());
    return 0;
  }
  nlohmann::json j{{"model", l.model->path()}, {"threads", l.engine->n_threads()}, {"block_size", a.o.block_size},
                   {"n_prompt", a.o.n_prompt}, {"n_gen", a.o.n_gen}, {"contiguous_tok_s", r.contiguous_tok_s},
                   {"paged_tok_s", r.paged_tok_s}, {"paged_vs_contiguous", r.paged_vs_contiguous},
                   {"system_tokens", a.o.system_tokens}, {"user_tokens", a.o.user_tokens},
                   {"ttft_cold_ms", r.ttft_cold_ms}, {"ttft_cached_ms", r.ttft_cached_ms},
                   {"cold_forward_tokens", r.cold_forward_tokens}, {"cached_forward_tokens", r.cached_forward_tokens},
                   {"cached_tokens", r.cached_tokens}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void add_kv(CLI::App& app, Runner& run) {
  auto s = std::make_shared<SimArgs>();
  CLI::App* c = app.add_subcommand("kv-sim", "KV memory waste / concurrency: paged blocks vs contiguous reservations");
  c->add_option("--tokens", s->c.budget_tokens, "KV budget in token slots")->capture_default_str();
  c->add_option("--kv-memory", s->kv_memory, "KV budget as a size (2GiB) or share of free RAM (40%); needs --bytes-per-token");
  c->add_option("--bytes-per-token", s->bytes_per_token, "KV bytes of one token (see `kvserve plan`)");
  c->add_option("--block-size", s->c.block_size, "Tokens per block")->capture_default_str()->check(CLI::Range(kMinUserBlockSize, kMaxUserBlockSize));
  c->add_option("--requests", s->c.n_requests, "Requests in the workload")->capture_default_str();
  c->add_option("--prompt-min", s->c.prompt_min)->capture_default_str();
  c->add_option("--prompt-max", s->c.prompt_max)->capture_default_str();
  c->add_option("--output-min", s->c.output_min)->capture_default_str();
  c->add_option("--output-max", s->c.output_max)->capture_default_str();
  c->add_option("--max-tokens", s->c.max_tokens, "Per-request generation limit")->capture_default_str();
  c->add_option("--ctx", s->c.max_ctx, "Model context (what 'reserve max context' reserves)")->capture_default_str();
  c->add_option("--seed", s->c.seed)->capture_default_str();
  c->add_flag("--json", s->json, "Print JSON");
  c->callback([s, &run] { run = [s] { return run_sim(*s); }; });

  auto b = std::make_shared<BenchArgs>();
  CLI::App* k = app.add_subcommand("kv-bench", "Paged vs contiguous decode speed; TTFT with a cached vs cold system prompt");
  add_model_args(k, b->m);
  k->add_option("--block-size", b->o.block_size, "Tokens per KV block (8-256)")->capture_default_str();
  k->add_option("-p,--n-prompt", b->o.n_prompt, "Decode test: context tokens before decoding")->capture_default_str();
  k->add_option("-n,--n-gen", b->o.n_gen, "Decode test: tokens decoded")->capture_default_str();
  k->add_option("--system-tokens", b->o.system_tokens, "TTFT test: cached system prompt length")->capture_default_str();
  k->add_option("--user-tokens", b->o.user_tokens, "TTFT test: new tokens per request")->capture_default_str();
  k->add_option("-r,--reps", b->o.reps, "Repetitions (median reported)")->capture_default_str()->check(CLI::Range(1, 1000));
  k->add_flag("--json", b->json, "Print one JSON object");
  k->callback([b, &run] { run = [b] { return run_kv_bench_cmd(*b); }; });
}

}  // namespace kvs::cli
