// `kvserve bench`: llama-bench style prefill (pp) and decode (tg) speed,
// repeated, mean ± sd, each set against the roofline of the `kvserve probe`
// profile: decode bytes read per token ÷ time vs the measured bandwidth,
// prefill ops ÷ time vs the measured peak of each arithmetic path.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/common.h"
#include "tools/progress.h"
#include "engine/local_sequence.h"
#include "tools/bench_roofline.h"
#include "tools/op_report.h"
#include "tools/plot_svg.h"
#include "tools/throttle_bench.h"

namespace kvs::cli {

namespace {
template <class... A>
std::string fmt_str(const char* f, A... args) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

struct BenchArgs {
  ModelArgs m;
  int p = 128, n = 64, reps = 5, depth = 0;
  int ubatch = LocalSequence::kDefaultChunk;  // tokens per forward pass of the prefill test
  bool json = false, throttle = false, ops = false;
  std::string profile;  // empty: the default profile if one exists
  KvArgs kv;
  std::string svg;             // tok/s vs context depth plot
  std::vector<int> svg_depths;  // its depths (default: powers of two up to the context)
};

// The roofline to print beside the results, or an empty one (with a hint on
// stderr) when there is no profile.
tools::BenchRoofline roofline_for(const std::string& flag, int threads, MatmulPrecision precision) {
  const std::string path = flag.empty() ? tools::default_profile_path() : flag;
  if (flag.empty() && !std::filesystem::exists(path)) {
    std::fprintf(stderr, "bench: no hardware profile at %s: run `kvserve probe` to print the roofline\n",
                 path.c_str());
    return {};
  }
  return tools::bench_roofline(tools::load_profile(path), path, threads, precision);
}

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

// --throttle: decode under a real throttle, without and with device shedding.
int run_throttle(const BenchArgs& a) {
  Loaded l = load_all(a.m);
  tools::ThrottleBenchOptions o;
  o.n_tokens = a.n;
  o.max_tokens = a.n;
  o.cache = a.kv.options();
  const tools::ThrottleReport r = tools::run_throttle_bench(*l.engine, o);
  if (a.json) {
    nlohmann::json j{{"model", l.model->path()}, {"throttle", r.throttle}, {"device", r.plan}};
    for (const tools::ThrottleRun* x : {&r.without, &r.with})
      j[x == &r.with ? "shedding" : "no_shedding"] = {{"threads", x->threads}, {"max_tokens", x->max_tokens},
                                                       {"tokens", x->tokens}, {"tpot_p50_ms", 1e3 * x->p50_s},
                                                       {"tpot_p99_ms", 1e3 * x->p99_s}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s", tools::format_throttle_report(r, l.model->config().name).c_str());
  }
  return 0;
}

// Decode tokens per second after `depth` tokens of context (prefilled once,
// untimed), mean over `reps` runs of `n` tokens.
Stat decode_rate(Engine& e, int depth, int n, int reps, const KvCacheOptions& kv, std::mt19937& rng, int n_vocab) {
  LocalSequence seq(e, depth + n + 1, 16, kv);
  std::uniform_int_distribution<int> tok(3, n_vocab - 1);
  std::vector<int32_t> ctx(static_cast<size_t>(depth));
  for (auto& t : ctx) t = tok(rng);
  if (depth > 0) seq.eval(ctx.data(), depth);
  std::vector<double> rates;
  for (int rep = 0; rep < reps; ++rep) {
    seq.truncate(depth);
    int32_t t = 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      seq.eval(&t, 1);
      t = tok(rng);
    }
    rates.push_back(n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return stat(rates);
}

// bench --svg: decode tok/s against context depth, one point per depth.
void write_depth_plot(const BenchArgs& a, Loaded& l) {
  const int ctx = l.model->config().n_ctx_train;
  std::vector<int> depths = a.svg_depths;
  if (depths.empty())
    for (int d = 0; d + a.n < ctx; d = d == 0 ? 64 : d * 2) depths.push_back(d);
  std::mt19937 rng(7);
  tools::Plot plot;
  plot.title = "Decode speed vs context depth (" + std::filesystem::path(l.model->path()).filename().string() + ")";
  plot.x_label = "context depth (tokens)";
  plot.y_label = "decode tokens / s";
  tools::PlotSeries s;
  s.name = "tg" + std::to_string(a.n) + " (" + std::to_string(l.engine->n_threads()) + " threads)";
  s.markers = true;
  tools::Progress bar("bench --svg", int64_t(depths.size()));
  for (size_t i = 0; i < depths.size(); ++i) {
    if (depths[i] + a.n + 1 > ctx) continue;
    const Stat st = decode_rate(*l.engine, depths[i], a.n, a.reps, a.kv.options(), rng, l.model->config().n_vocab);
    s.points.emplace_back(double(depths[i]), st.mean);
    bar.update(int64_t(i + 1));
  }
  bar.finish();
  plot.series.push_back(std::move(s));
  plot.y_min = 0;
  plot.write(a.svg);
  std::fprintf(stderr, "bench: wrote %s\n", a.svg.c_str());
}

struct BenchRuns {
  std::vector<double> pp, tg;  // tokens/s of each measured repetition
  tools::OpColumn pp_ops, tg_ops;  // --ops: the measured repetitions' phases
};

// --ops: the engine's phase times of one timed test (reset before it), added to col.
void collect_ops(const Engine& e, tools::OpColumn& col, double wall_s, int tokens) {
  tools::add_op_times(col.ops, e.stats().ops);
  col.wall_s += wall_s;
  col.tokens += tokens;
}

// One warm-up of each test, then the measured repetitions, on `seq`.
BenchRuns measure_runs(const BenchArgs& a, Engine& e, LocalSequence& seq, int n_vocab) {
  using clock = std::chrono::steady_clock;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> tok(3, n_vocab - 1);
  std::vector<int32_t> prompt(a.p);
  std::vector<int32_t> ctx_prompt(static_cast<size_t>(a.depth));
  for (auto& t : ctx_prompt) t = tok(rng);
  bool at_depth = false;  // the depth prefix is in the cache
  for (auto& t : prompt) t = tok(rng);
  BenchRuns r;
  r.pp_ops.test = "pp" + std::to_string(a.p);
  r.tg_ops.test = "tg" + std::to_string(a.n);
  std::vector<double>& pp = r.pp;
  std::vector<double>& tg = r.tg;
  e.set_op_timing(a.ops);
  tools::Progress bar("bench", a.reps);
  for (int rep = -1; rep < a.reps; ++rep) {
    if (a.p > 0) {
      seq.reset();
      at_depth = false;
      e.reset_op_times();
      auto t0 = clock::now();
      seq.eval(prompt.data(), a.p, false, a.ubatch);
      double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (rep >= 0) pp.push_back(a.p / s);
      if (rep >= 0) collect_ops(e, r.pp_ops, s, a.p);
    }
    if (a.n > 0) {
      // Decode after `depth` tokens of context (prefilled once, untimed;
      // each repetition goes back to it).
      if (a.depth > 0 && at_depth) {
        seq.truncate(a.depth);
      } else {
        seq.reset();
        if (a.depth > 0) {
          seq.eval(ctx_prompt.data(), a.depth);
          at_depth = true;
        }
      }
      int32_t t = 1;
      e.reset_op_times();
      auto t0 = clock::now();
      for (int i = 0; i < a.n; ++i) {
        seq.eval(&t, 1);
        t = tok(rng);
      }
      double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (rep >= 0) tg.push_back(a.n / s);
      if (rep >= 0) collect_ops(e, r.tg_ops, s, a.n);
    }
    bar.update(rep + 1);  // draws only on a terminal: logs get no \r
  }
  bar.finish();
  e.set_op_timing(false);
  return r;
}

// The table or JSON line of a run: rates, bytes read and the roofline.
void report_runs(const BenchArgs& a, const Loaded& l, const LocalSequence& seq, const BenchRuns& runs) {
  const ModelConfig& c = l.model->config();
  const std::vector<double>& pp = runs.pp;
  const std::vector<double>& tg = runs.tg;
  // Bytes a decode step must read: every weight except the embedding table
  // (one row; of a MoE layer only the experts it runs) plus, on average,
  // half the KV of the run.
  const double w_bytes = tools::decode_weight_bytes(*l.model);
  const double kv_tok = seq.layout().bytes_per_token_avg();
  const double bytes_per_token = w_bytes + kv_tok * (a.depth + a.n / 2.0);
  Stat sp = pp.empty() ? Stat{} : stat(pp), st = tg.empty() ? Stat{} : stat(tg);
  const tools::BenchRoofline roof = roofline_for(a.profile, l.engine->n_threads(), l.model->precision());
  const tools::PrefillOps ops = tools::prefill_ops_per_token(*l.model, a.p);
  const double t_roof = tools::prefill_roofline_seconds(ops, roof);
  const double pp_peak_frac = t_roof > 0 && sp.mean > 0 ? t_roof * sp.mean : 0;  // roofline time / measured time
  const double decode_gbs = st.mean * bytes_per_token / 1e9;
  const double bw_frac = roof.bandwidth > 0 ? decode_gbs * 1e9 / roof.bandwidth : 0;
  if (a.json) {
    nlohmann::json j{{"model", l.model->path()}, {"threads", l.engine->n_threads()},
                     {"pp", a.p}, {"tg", a.n}, {"depth", a.depth}, {"reps", a.reps},
                     {"kv", seq.layout().describe()}, {"precision", precision_name(l.model->precision())},
                     {"pp_tokens_per_s", sp.mean}, {"pp_sd", sp.sd},
                     {"tg_tokens_per_s", st.mean}, {"tg_sd", st.sd},
                     {"decode_bytes_per_token", bytes_per_token},
                     {"decode_gb_per_s", decode_gbs},
                     {"pp_ops_per_token", ops.total()},
                     {"pp_ops_per_s", ops.total() * sp.mean}};
    if (!roof.source.empty()) {
      j["profile"] = roof.source;
      j["profile_bandwidth_gb_per_s"] = roof.bandwidth / 1e9;
      j["decode_bandwidth_fraction"] = bw_frac;
      j["profile_peak_int8_ops"] = roof.peak_int8;
      j["profile_peak_fp32_ops"] = roof.peak_fp32;
      j["pp_roofline_tokens_per_s"] = t_roof > 0 ? 1.0 / t_roof : 0.0;
      j["pp_peak_fraction"] = pp_peak_frac;
    }
    if (a.ops) {
      if (a.p > 0) j["ops"]["pp"] = tools::op_json(runs.pp_ops);
      if (a.n > 0) j["ops"]["tg"] = tools::op_json(runs.tg_ops);
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("| model | threads | test | tok/s | GB/s read | roofline (kvserve probe) |\n|---|---|---|---|---|---|\n");
    if (a.p > 0) {
      std::string r = "—";
      if (t_roof > 0)
        r = fmt_str("%.0f GOP/s = %.0f%% of peak (%.0f tok/s at peak)", ops.total() * sp.mean / 1e9,
                    100 * pp_peak_frac, 1.0 / t_roof);
      std::printf("| %s | %d | pp%d | %.2f ± %.2f | | %s |\n", c.name.c_str(), l.engine->n_threads(), a.p, sp.mean,
                  sp.sd, r.c_str());
    }
    if (a.n > 0) {
      std::string r = "—";
      if (roof.bandwidth > 0) r = fmt_str("%.0f%% of %.1f GB/s", 100 * bw_frac, roof.bandwidth / 1e9);
      std::printf("| %s | %d | tg%d%s | %.2f ± %.2f | %.1f | %s |\n", c.name.c_str(), l.engine->n_threads(), a.n,
                  a.depth > 0 ? (" @ d" + std::to_string(a.depth) + " " + seq.layout().describe()).c_str() : "", st.mean,
                  st.sd, decode_gbs, r.c_str());
    }
    if (a.ops) {
      std::vector<tools::OpColumn> cols;
      if (a.p > 0) cols.push_back(runs.pp_ops);
      if (a.n > 0) cols.push_back(runs.tg_ops);
      std::printf("\nWhere the time goes (--ops: wall time per phase of the forward pass, all threads):\n\n%s",
                  tools::format_op_table(cols).c_str());
    }
  }
}

int run_bench(const BenchArgs& a) {
  // -p 0 or -n 0 skips that test; a run that measures nothing is a mistake.
  if ((a.throttle || !a.svg.empty()) && a.n < 1)
    throw std::invalid_argument(std::string(a.throttle ? "--throttle" : "--svg") + " measures decode: give -n >= 1");
  if (a.p == 0 && a.n == 0)
    throw std::invalid_argument("-p and -n are both 0: nothing to measure (give -p or -n >= 1)");
  if (a.throttle) return run_throttle(a);
  Loaded l = load_all(a.m);
  LocalSequence seq(*l.engine, std::max(a.p, a.depth + a.n) + 1, 16, a.kv.options());
  report_runs(a, l, seq, measure_runs(a, *l.engine, seq, l.model->config().n_vocab));
  if (!a.svg.empty()) write_depth_plot(a, l);
  return 0;
}

}  // namespace

void add_bench(CLI::App& app, Runner& run) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* c = app.add_subcommand("bench", "Prefill and decode speed (llama-bench style)");
  add_model_args(c, a->m);
  c->add_option("-p,--n-prompt", a->p, "Prompt tokens for the prefill test (0 = skip)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("-n,--n-gen", a->n, "Tokens for the decode test (0 = skip)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("--ubatch", a->ubatch,
                "Prompt tokens per forward pass of the prefill test (llama-bench -ub; the default is serve's "
                "--max-batch-tokens, so pp measures the chunks a served prompt runs in)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("-r,--reps", a->reps, "Repetitions")->capture_default_str()->check(CLI::Range(1, 1000));
  c->add_option("-d,--depth", a->depth, "Decode test after this many tokens of context (llama-bench -d)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  c->add_flag("--json", a->json, "Print one JSON object");
  auto* ops = c->add_flag("--ops", a->ops,
                          "Also time each phase of the forward pass (norms, projections, RoPE and K/V stores, "
                          "attention, FFN, output) and print ms per token and share of the measured time, per test");
  c->add_flag("--throttle", a->throttle,
              "Decode -n tokens under a throttle (cgroup cpu.max or a busy process on CPU 0, plus a fake hot "
              "thermal zone): TPOT p50/p99 without and with the device shedding policy (docs/ON-DEVICE.md)")
      ->excludes(ops);
  auto* svg = c->add_option("--svg", a->svg, "Also write an SVG plot of decode tok/s vs context depth to this file");
  c->add_option("--svg-depths", a->svg_depths, "Context depths of the --svg plot (default: 0, 64, 128, ... up to the context)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 24))
      ->needs(svg);
  c->add_option("--profile", a->profile,
                "Hardware profile for the roofline column (default: $KVS_PROFILE or ~/.config/kvserve/profile.json, "
                "written by `kvserve probe`)");
  add_kv_args(c, a->kv);
  c->callback([a, &run] { run = [a] { return run_bench(*a); }; });
}

}  // namespace kvs::cli
