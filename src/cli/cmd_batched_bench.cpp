// `kvserve batched-bench`: aggregate throughput of the engine loop at several
// numbers of concurrent sequences (llama-batched-bench style: each request
// has its own random prompt of -p tokens and generates -n), and a long-burst
// test (--burst): many long prompts at once into a pool that holds only some,
// reporting who ran, who was rejected with which Retry-After, and TTFTs.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "sched/clock.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/kv_cache.h"
#include "kv/capacity.h"
#include "kv/window_policy.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "sched/engine_loop.h"
#include "tools/op_report.h"

namespace kvs::cli {

namespace {

struct Args {
  ModelArgs m;
  KvArgs kv;  // --kv-type and friends (llama-batched-bench's cache is f16)
  int p = 128, n = 32;
  std::string npl = "1,4,16,64";
  int max_batch_tokens = 2048;
  int block_size = 16;
  int burst = 0;          // > 0: long-burst mode with this many requests
  int burst_fit = 8;      // the pool holds this many burst requests
  int burst_queue = 8;    // --max-queue in burst mode
  bool json = false;
  bool ops = false;  // --ops: the per-op timer over each concurrency's run
  // Constrained decoding: every request under this grammar (--grammar FILE
  // in GBNF, --json-object, --json-schema FILE), at --temp.
  std::string grammar_file, schema_file;
  bool json_object = false;
  float temp = 0;
  std::shared_ptr<const grammar::Grammar> grammar;
};

std::shared_ptr<const grammar::Grammar> load_grammar(const Args& a) {
  auto read = [](const std::string& f) {
    std::ifstream in(f);
    if (!in) throw std::runtime_error("batched-bench: cannot read " + f);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  std::string gbnf;
  if (!a.grammar_file.empty()) gbnf = read(a.grammar_file);
  else if (!a.schema_file.empty()) gbnf = grammar::json_schema_gbnf(nlohmann::ordered_json::parse(read(a.schema_file)));
  else if (a.json_object) gbnf = grammar::json_object_gbnf();
  else return nullptr;
  return std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(gbnf));
}

struct Tracker {
  std::mutex mu;
  std::vector<double> first, last;
  std::vector<int> tokens;
  explicit Tracker(int n) : first(size_t(n), -1), last(size_t(n), -1), tokens(size_t(n), 0) {}
  sched::EventSink sink(int i) {
    return [this, i](sched::TokenEvent&& e) {
      std::lock_guard lk(mu);
      const double t = sched::steady_now();
      if (e.token >= 0) {
        if (first[size_t(i)] < 0) first[size_t(i)] = t;
        ++tokens[size_t(i)];
      }
      if (e.finish != sched::FinishReason::None) last[size_t(i)] = t;
      return true;
    };
  }
};

sched::Request make_req(const std::vector<int32_t>& prompt, int n, const Args* a = nullptr, uint64_t seed = 0) {
  sched::Request r;
  r.prompt = prompt;
  r.max_tokens = n;
  r.sampling.temperature = a ? a->temp : 0;
  r.sampling.seed = seed;
  r.ignore_eos = true;
  if (a) r.grammar = a->grammar;
  return r;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int n_vocab, int len) {
  std::uniform_int_distribution<int> d(3, n_vocab - 1);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = d(rng);
  return p;
}

// Blocks one sequence of `tokens` tokens holds at most, every KV table (a
// hybrid cache's windowed tables at their bound).
int64_t blocks_per_sequence(const Loaded& l, int block_size, int64_t tokens, int step, const KvCacheOptions& cache) {
  const KvLayout layout = kv_layout_for(*l.engine, block_size, cache);
  return sequence_block_cap(table_windows(WindowPolicy{}, layout.groups), tokens, block_size, step);
}

// One concurrency's run: b requests at once, timed from the first submit.
struct ThroughputRow {
  int b = 0;
  double t_pp = 0, t_end = 0;
  int64_t gen = 0;      // tokens generated after each request's first
  double tpot_ms = 0;   // median over requests
  int64_t steps = 0;
  tools::OpColumn ops;  // --ops: the run's forward phases
};

ThroughputRow run_one(const Args& a, Loaded& l, int b, std::mt19937& rng) {
  sched::EngineLoopOptions o;
  o.block_size = a.block_size;
  o.max_ctx = a.p + a.n + 1;
  o.cache = a.kv.options();
  const int64_t per = blocks_per_sequence(l, a.block_size, a.p + a.n, std::max(a.max_batch_tokens, a.p), o.cache);
  o.kv_blocks = per * b * 5 / 4 + per + 8;  // all fit, past headroom and the interactive reserve
  o.prefix_caching = false;                 // distinct prompts anyway; measure compute
  o.sched.max_batch_tokens = std::max(a.max_batch_tokens, a.p);
  o.sched.max_seqs = std::max(b, 1);
  o.sched.max_queue = b;
  o.sched.max_request_share = 1.0;
  o.sched.tenant_quota_share = 1.0;
  // Measures the engine, not admission: B = 64 prefills take longer than the
  // interactive class's default 10 s queue limit, which would reject some.
  o.sched.wait_limit_s = {600, 600};
  o.log = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
  ThroughputRow row;
  row.b = b;
  Tracker tr(b);
  // The engine thread owns the engine's stats while the loop lives: timing
  // is set before it starts and read after it has stopped.
  l.engine->set_op_timing(a.ops);
  l.engine->reset_op_times();
  {
    sched::EngineLoop loop(*l.engine, l.tok.get(), o);
    const double t0 = sched::steady_now();
    for (int i = 0; i < b; ++i) {
      sched::Request r = make_req(random_prompt(rng, l.model->config().n_vocab, a.p), a.n, &a, uint64_t(i));
      r.sink = tr.sink(i);
      const auto res = loop.submit(std::move(r));
      if (!res.accepted) throw std::runtime_error("batched-bench: request rejected: " + res.message);
    }
    loop.wait_idle();
    row.t_pp = *std::max_element(tr.first.begin(), tr.first.end()) - t0;
    row.t_end = *std::max_element(tr.last.begin(), tr.last.end()) - t0;
    row.steps = loop.metrics().steps;
  }
  l.engine->set_op_timing(false);
  row.ops = {"B=" + std::to_string(b), l.engine->stats().ops, row.t_end, int64_t(b) * (a.p + a.n)};
  // Tokens as generated (a grammar may end a request before -n).
  for (int k : tr.tokens) row.gen += std::max(0, k - 1);
  // Per request: seconds per token after its first.
  std::vector<double> tpot;
  for (int i = 0; i < b; ++i)
    if (tr.tokens[size_t(i)] > 1) tpot.push_back((tr.last[size_t(i)] - tr.first[size_t(i)]) / (tr.tokens[size_t(i)] - 1));
  std::sort(tpot.begin(), tpot.end());
  row.tpot_ms = tpot.empty() ? 0 : tpot[tpot.size() / 2] * 1e3;
  return row;
}

// --npl "1,4,16": each item a whole number of sequences, 1 to 4096 (each
// holds its own KV, so more is a typo, not a benchmark).
std::vector<int> parse_npl(const std::string& text) {
  std::vector<int> npls;
  std::stringstream ss(text);
  std::string x;
  while (std::getline(ss, x, ',')) {
    int v = 0;
    const auto [end, ec] = std::from_chars(x.data(), x.data() + x.size(), v);
    if (x.empty() || ec != std::errc() || end != x.data() + x.size() || v < 1 || v > 4096)
      throw std::invalid_argument("--npl item '" + x + "' in '" + text +
                                  "' is not a number of concurrent sequences from 1 to 4096 (e.g. --npl 1,4,16)");
    npls.push_back(v);
  }
  if (npls.empty() || text.back() == ',')
    throw std::invalid_argument("--npl '" + text + "' lists no concurrency (e.g. --npl 1,4,16)");
  return npls;
}

int run_throughput(const Args& a, Loaded& l) {
  const std::vector<int> npls = parse_npl(a.npl);
  std::mt19937 rng(42);
  nlohmann::json rows = nlohmann::json::array();
  std::vector<tools::OpColumn> op_cols;
  if (!a.json)
    std::printf("| PP | TG | B | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s | TPOT ms (p50) |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n");
  for (int b : npls) {
    const ThroughputRow r = run_one(a, l, b, rng);
    const double t_tg = r.t_end - r.t_pp;
    const double s_pp = double(b) * a.p / r.t_pp, s_tg = double(r.gen) / t_tg;
    const double s = double(b) * (a.p + a.n) / r.t_end;
    if (a.json) {
      rows.push_back({{"pp", a.p}, {"tg", a.n}, {"b", b}, {"t_pp", r.t_pp}, {"s_pp", s_pp}, {"t_tg", t_tg},
                      {"s_tg", s_tg}, {"t", r.t_end}, {"s", s}, {"tpot_ms_p50", r.tpot_ms}, {"generated", r.gen + b},
                      {"steps", r.steps}});
      if (a.ops) rows.back()["ops"] = tools::op_json(r.ops);
    } else {
      std::printf("| %d | %d | %d | %.2f | %.1f | %.2f | %.1f | %.2f | %.1f | %.1f |\n", a.p, a.n, b, r.t_pp, s_pp,
                  t_tg, s_tg, r.t_end, s, r.tpot_ms);
    }
    op_cols.push_back(r.ops);
    std::fflush(stdout);
  }
  if (a.json)
    std::printf("%s\n", nlohmann::json{{"model", l.model->path()},
                                       {"threads", l.engine->n_threads()},
                                       {"kv_type", to_string(a.kv.options().type)},
                                       {"precision", precision_name(l.model->precision())},
                                       {"rows", rows}}
                            .dump()
                            .c_str());
  else if (a.ops)
    std::printf("\nWhere the time goes (--ops: wall time per phase of the forward passes, prefill and decode steps "
                "together; per token of prompt and generation):\n\n%s",
                tools::format_op_table(op_cols).c_str());
  return 0;
}

int run_burst(const Args& a, Loaded& l) {
  const int nv = l.model->config().n_vocab;
  std::mt19937 rng(7);
  sched::EngineLoopOptions o;
  o.block_size = a.block_size;
  o.max_ctx = a.p + a.n + 1;
  o.cache = a.kv.options();
  const int64_t per = blocks_per_sequence(l, a.block_size, a.p + a.n, a.max_batch_tokens, o.cache);
  // A pool whose interactive limit (total - 5% headroom) holds burst_fit requests.
  o.kv_blocks = (per * a.burst_fit * 100 + 94) / 95;
  o.sched.max_batch_tokens = a.max_batch_tokens;
  o.sched.max_seqs = a.burst;
  o.sched.max_queue = a.burst_queue;
  o.sched.max_request_share = 1.0;
  o.sched.tenant_quota_share = 1.0;
  o.sched.wait_limit_s = {600, 600};
  sched::EngineLoop loop(*l.engine, l.tok.get(), o);
  Tracker tr(a.burst);
  const double t0 = sched::steady_now();
  std::vector<sched::SubmitResult> res;
  for (int i = 0; i < a.burst; ++i) {
    sched::Request r = make_req(random_prompt(rng, nv, a.p), a.n, &a, uint64_t(i));  // --temp, --grammar too
    r.sink = tr.sink(i);
    res.push_back(loop.submit(std::move(r)));
  }
  loop.wait_idle();
  const auto m = loop.metrics();
  nlohmann::json j{{"requests", a.burst}, {"prompt", a.p}, {"gen", a.n}, {"kv_blocks", o.kv_blocks},
                   {"blocks_per_request", per}, {"preemptions", m.preemptions}};
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < a.burst; ++i) {
    const auto& r = res[size_t(i)];
    nlohmann::json row{{"i", i}, {"accepted", r.accepted}};
    if (!r.accepted) {
      row["reason"] = sched::to_string(r.reason);
      row["retry_after_s"] = r.retry_after_s;
    } else {
      row["ttft_s"] = tr.first[size_t(i)] - t0;
      row["e2e_s"] = tr.last[size_t(i)] - t0;
      row["tokens"] = tr.tokens[size_t(i)];
    }
    rows.push_back(row);
  }
  j["rows"] = rows;
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("pool %lld blocks of %d, %lld blocks per request, %d requests at once\n", (long long)o.kv_blocks,
                a.block_size, (long long)per, a.burst);
    std::printf("| # | result | TTFT s | e2e s | Retry-After s |\n|---|---|---|---|---|\n");
    for (const auto& r : rows) {
      if (r["accepted"])
        std::printf("| %d | ran (%d tokens) | %.2f | %.2f | |\n", int(r["i"]), int(r["tokens"]), double(r["ttft_s"]),
                    double(r["e2e_s"]));
      else
        std::printf("| %d | rejected: %s | | | %.0f |\n", int(r["i"]), std::string(r["reason"]).c_str(),
                    double(r["retry_after_s"]));
    }
  }
  return 0;
}

}  // namespace

void add_batched_bench(CLI::App& app, Runner& run) {
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("batched-bench", "Continuous-batching throughput at several concurrencies; --burst: admission under a long-prompt burst");
  add_model_args(c, a->m);
  c->add_option("-p,--n-prompt", a->p, "Prompt tokens per request")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  c->add_option("-n,--n-gen", a->n, "Tokens generated per request")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  auto* npl = c->add_option("--npl", a->npl, "Concurrent sequences, comma-separated")->capture_default_str();
  c->add_option("--max-batch-tokens", a->max_batch_tokens, "Token budget per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  c->add_option("--block-size", a->block_size, "KV block size")->capture_default_str();
  add_kv_args(c, a->kv);
  c->add_option("--grammar", a->grammar_file, "Constrain every request to this GBNF grammar");
  c->add_option("--json-schema", a->schema_file, "Constrain every request to JSON matching this schema file");
  c->add_flag("--json-object", a->json_object, "Constrain every request to a JSON object");
  c->add_option("--temp", a->temp, "Sampling temperature (0 = greedy)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  auto* burst = c->add_option("--burst", a->burst, "Long-burst mode: this many requests at once")
                    ->capture_default_str()
                    ->check(CLI::Range(1, 1 << 16))
                    ->excludes(npl);  // burst mode runs one concurrency: --burst
  c->add_option("--burst-fit", a->burst_fit, "Burst mode: requests the pool holds")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16))
      ->needs(burst);
  c->add_option("--burst-queue", a->burst_queue, "Burst mode: --max-queue")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16))
      ->needs(burst);
  c->add_flag("--json", a->json, "Print JSON");
  c->add_flag("--ops", a->ops,
              "Also time each phase of the forward passes (as bench --ops), per concurrency, prefill and decode steps "
              "together (a small -p isolates decode)")
      ->excludes("--burst");
  c->callback([a, &run] {
    run = [a] {
      if (a->burst == 0) (void)parse_npl(a->npl);  // errors before the model loads
      a->grammar = load_grammar(*a);
      (void)a->kv.options();          // likewise a bad --kv-type
      Loaded l = load_all(a->m);
      return a->burst > 0 ? run_burst(*a, l) : run_throughput(*a, l);
    };
  });
}

}  // namespace kvs::cli
