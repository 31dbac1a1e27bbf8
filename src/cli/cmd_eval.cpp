// `kvserve eval`: the quality price of a KV cache policy. Default mode:
// perplexity (llama.cpp protocol), KL divergence against an f32 cache and
// KV bytes per token. --stream: one long text token by token through a
// window policy, PPL per segment, peak KV memory, optional SVG plot.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/kv_eval.h"
#include "tools/plot_svg.h"
#include "tools/progress.h"

namespace kvs::cli {

namespace {

std::string ppl_note(double ppl) {
  char b[48];
  std::snprintf(b, sizeof b, "PPL %.4f", ppl);
  return b;
}
struct EvalArgs {
  ModelArgs m;
  KvArgs kv;
  std::string file, svg;
  int ctx = 512, block_size = 16, repeat = 1;
  WindowArgs w;
  bool stream = false, oracle = false, compare = false, json = false;
  int oracle_stride = 1, segment = 1000;
};

nlohmann::json stream_json(const std::string& name, const StreamEvalResult& r) {
  nlohmann::json seg = nlohmann::json::array();
  for (auto [t, p] : r.segment_ppl) seg.push_back({t, p});
  return {{"policy", name}, {"ppl", r.ppl}, {"scored_tokens", r.n_scored}, {"peak_kv_bytes", r.peak_kv_bytes},
          {"peak_blocks", r.peak_blocks}, {"segment_ppl", seg}};
}

int run_stream(const EvalArgs& a, Loaded& l, const std::vector<int>& toks) {
  StreamEvalOptions base;
  base.block_size = a.block_size;
  base.cache = a.kv.options();
  base.segment = a.segment;
  base.oracle_stride = a.oracle_stride;
  base.oracle_window = a.w.window > 0 ? a.w.window : 256;
  std::vector<std::pair<std::string, StreamEvalOptions>> runs;
  if (a.compare) {
    // The policies of the StreamingLLM comparison, at the same window, plus
    // naive dropping (sinks kept at their text positions) for contrast. A
    // window without sinks needs no such variant: RoPE scores depend only on
    // the distance between query and key, which a common shift keeps.
    const int W = base.oracle_window;
    StreamEvalOptions o = base;
    o.oracle = true;
    runs.emplace_back("sliding-window recompute (oracle)", o);
    o = base;
    o.window = WindowPolicy::streaming(W, 0);
    runs.emplace_back("window " + std::to_string(W), o);
    const int S = a.w.sinks > 0 ? a.w.sinks : 4;
    o.window = WindowPolicy::streaming(W, S, /*text_positions=*/true);
    runs.emplace_back(std::to_string(S) + " sinks + window " + std::to_string(W) + ", text positions (naive)", o);
    o.window = WindowPolicy::streaming(W, a.w.sinks > 0 ? a.w.sinks : 4);
    runs.emplace_back(std::to_string(a.w.sinks > 0 ? a.w.sinks : 4) + " sinks + window " + std::to_string(W), o);
    o.window = WindowPolicy::context_shift(a.w.shift_ctx > 0 ? a.w.shift_ctx : W, a.w.n_keep);
    runs.emplace_back("context shift (cache " + std::to_string(o.window.ctx) + ", keep " + std::to_string(a.w.n_keep) + ")", o);
  } else {
    StreamEvalOptions o = base;
    o.oracle = a.oracle;
    if (!a.oracle) o.window = a.w.policy();
    if (a.oracle && a.w.window <= 0) throw std::invalid_argument("--oracle needs --kv-window (the recompute window)");
    runs.emplace_back(a.oracle ? "sliding-window recompute (oracle)" : o.window.describe(), o);
  }
  nlohmann::json all = nlohmann::json::array();
  tools::Plot plot;
  plot.title = "Streaming perplexity, " + std::to_string(toks.size()) + " tokens";
  plot.x_label = "tokens processed";
  plot.y_label = "PPL of the last " + std::to_string(a.segment) + " tokens";
  plot.log_y = true;
  for (auto& [name, o] : runs) {
    std::fprintf(stderr, "eval --stream: %s\n", name.c_str());
    tools::Progress bar("eval " + name, 0);
    const StreamEvalResult r = stream_eval(*l.engine, toks, o, [&](int64_t d, int64_t n, double p) {
      if (bar.enabled()) bar.update_total(d, n, ppl_note(p));
      else std::fprintf(stderr, "  [%lld/%lld] running PPL %.4f\n", (long long)d, (long long)n, p);
    });
    bar.finish();
    all.push_back(stream_json(name, r));
    tools::PlotSeries s;
    s.name = name;
    for (auto [t, p] : r.segment_ppl) s.points.emplace_back(double(t), p);
    s.markers = true;
    plot.series.push_back(std::move(s));
    if (!a.json)
      std::printf("%-45s PPL %10.4f  peak KV %8.1f KiB (%d blocks)\n", name.c_str(), r.ppl, r.peak_kv_bytes / 1024.0,
                  r.peak_blocks);
  }
  if (!a.svg.empty()) {
    plot.write(a.svg);
    std::fprintf(stderr, "eval: wrote %s\n", a.svg.c_str());
  }
  if (a.json) std::printf("%s\n", (all.size() == 1 ? all[0] : all).dump().c_str());
  else
    for (const auto& j : all) {
      std::printf("%s, PPL per %d tokens:", j["policy"].get<std::string>().c_str(), a.segment);
      for (const auto& s : j["segment_ppl"]) std::printf(" %.2f", s[1].get<double>());
      std::printf("\n");
    }
  return 0;
}

int run_eval(const EvalArgs& a) {
  Loaded l = load_all(a.m, a.ctx);
  const Vocab& v = l.model->vocab();
  std::vector<int> one = l.tok->encode(read_text_file(a.file), v.add_bos);
  std::vector<int> toks = one;
  // Repeats continue the text (no second BOS).
  const size_t skip = v.add_bos && !one.empty() && one[0] == v.bos ? 1 : 0;
  for (int i = 1; i < a.repeat; ++i) toks.insert(toks.end(), one.begin() + long(skip), one.end());
  std::fprintf(stderr, "eval: %zu tokens (%d× the file), KV %s\n", toks.size(), a.repeat,
               kv_layout_for(*l.engine, a.block_size, a.kv.options()).describe().c_str());
  if (a.stream || a.oracle || a.compare) return run_stream(a, l, toks);
  KvEvalOptions o;
  o.block_size = a.block_size;
  o.cache = a.kv.options();
  o.window = a.w.policy();
  // bf16 matmuls are measured against fp32 ones: the reference runs on an
  // fp32 load of the same file.
  std::unique_ptr<Engine> fp32;
  const bool bf16 = l.model->precision() == MatmulPrecision::Bf16;
  if (bf16) {
    std::fprintf(stderr, "eval: loading the model again with fp32 products for the reference\n");
    EngineOptions eo;
    eo.n_threads = a.m.threads;
    eo.n_ctx = a.ctx;
    fp32 = std::make_unique<Engine>(Model::load(l.model->path(), a.m.tokenizer), eo);
    o.reference = fp32.get();
  }
  const char* ref_name = bf16 ? "fp32 products, f32 cache" : "f32 cache";
  tools::Progress bar("eval", 0);
  const KvEvalResult r = kv_eval(*l.engine, toks, a.ctx, v.add_bos ? v.bos : -1, o, [&](int d, int n, double p) {
    if (bar.enabled()) bar.update_total(d, n, ppl_note(p));
    else std::fprintf(stderr, "  [%d/%d] running PPL %.4f\n", d, n, p);
  });
  bar.finish();
  const double dppl = 100.0 * (r.ppl - r.ppl_ref) / r.ppl_ref;
  if (a.json) {
    nlohmann::json j{{"ppl", r.ppl}, {"ppl_f32", r.ppl_ref}, {"delta_ppl_pct", dppl}, {"kl", r.kl},
                     {"top1_agreement", r.top1}, {"kv_bytes_per_token", r.kv_bytes_per_token},
                     {"kv_type", a.kv.type}, {"key_scale", a.kv.key_scale},
                     {"kv", kv_layout_for(*l.engine, a.block_size, a.kv.options()).describe()},
                     {"window", o.window.describe()}, {"ctx", a.ctx}, {"chunks", r.n_chunks},
                     {"scored_tokens", r.n_scored}, {"model", l.model->path()},
                     {"precision", precision_name(l.model->precision())}, {"reference", ref_name}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("PPL %.4f (%s %.4f, %+.3f%%), KL %.6f nats/token, top-1 agreement %.2f%%, KV %.1f bytes/token\n",
                r.ppl, ref_name, r.ppl_ref, dppl, r.kl, 100 * r.top1, r.kv_bytes_per_token);
  }
  return 0;
}
}  // namespace

void add_eval(CLI::App& app, Runner& run) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* c = app.add_subcommand("eval", "Quality of a KV cache policy: PPL, KL vs f32 cache, bytes/token; --stream for windows");
  add_model_args(c, a->m);
  add_kv_args(c, a->kv);
  c->add_option("-f,--file", a->file, "Text file")->required()->check(CLI::ExistingFile);
  c->add_option("-c,--ctx", a->ctx, "Context per chunk (perplexity protocol)")->capture_default_str()->check(CLI::Range(4, 1 << 20));
  c->add_option("--block-size", a->block_size, "Tokens per KV block")->capture_default_str()->check(CLI::Range(1, 256));
  c->add_option("--repeat", a->repeat, "Evaluate the file's text N times in a row")->capture_default_str()->check(CLI::Range(1, 1000));
  add_window_args(c, a->w);
  auto* stream = c->add_flag("--stream", a->stream, "Token-by-token stream through the window policy, PPL per segment");
  auto* oracle =
      c->add_flag("--oracle", a->oracle, "Stream with sliding-window recompute over --kv-window tokens (slow, exact)");
  // --compare runs its own set of policies, the oracle among them.
  c->add_flag("--compare", a->compare,
              "Stream the policies side by side (oracle, window, naive window, sinks + window, context shift) at --kv-window")
      ->excludes(stream)
      ->excludes(oracle);
  c->add_option("--oracle-stride", a->oracle_stride, "Oracle: score every k-th token")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  c->add_option("--segment", a->segment, "Stream: tokens per PPL point")->capture_default_str()->check(CLI::Range(1, 1 << 24));
  auto* svg = c->add_option("--svg", a->svg, "Stream: write a plot of PPL against tokens processed");
  c->add_flag("--json", a->json, "Print JSON (ppl, kl, kv_bytes_per_token, ...)");
  c->callback([a, svg, &run] {
    // The default mode has no stream to plot: --svg alone would write nothing.
    if (svg->count() && !a->stream && !a->oracle && !a->compare)
      throw CLI::ValidationError("--svg", "plots a stream: give it with --stream, --oracle or --compare");
    run = [a] { return run_eval(*a); };
  });
}

}  // namespace kvs::cli
