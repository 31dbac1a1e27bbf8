// `kvserve generate`: one prompt, one completion, streamed to stdout (or one
// JSON object with --json).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/generate.h"

namespace kvs::cli {

namespace {
struct GenerateArgs {
  ModelArgs m;
  std::string prompt = "Once upon a time";
  int n = 128;
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
  int top_k = 40;
  int64_t seed = -1;
  int ctx = 0;
  bool json = false, ignore_eos = false;
  std::vector<std::string> stop;
  KvArgs kv;
  WindowArgs window;
};

int run_generate(const GenerateArgs& a) {
  Loaded l = load_all(a.m, a.ctx);
  GenerateParams p;
  p.max_tokens = a.n;
  p.n_ctx = a.ctx;
  p.cache = a.kv.options();
  p.window = a.window.policy();
  p.stop = a.stop;
  p.ignore_eos = a.ignore_eos;
  p.sampling.temperature = a.temp;
  p.sampling.top_k = a.top_k;
  p.sampling.top_p = a.top_p;
  p.sampling.min_p = a.min_p;
  p.sampling.repeat_penalty = a.repeat_penalty;
  p.sampling.seed = a.seed >= 0 ? uint64_t(a.seed) : std::random_device{}();
  std::vector<int> prompt = l.tok->encode(a.prompt, l.model->vocab().add_bos);
  // The prompt is echoed with the first text, not before: generate() checks
  // the prompt against the context and builds the cache first, and a script
  // reading stdout must get nothing when one of those fails.
  bool echoed = a.json;
  auto out = [&](const std::string& s) {
    if (!echoed) std::fwrite(a.prompt.data(), 1, a.prompt.size(), stdout), echoed = true;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  GenerateResult r = generate(*l.engine, *l.tok, prompt, p, [&](const std::string& s) {
    if (!a.json) out(s);
    return true;
  });
  if (!echoed) out("");  // nothing generated: the prompt alone
  const double pp_tps = r.prefill_seconds > 0 ? r.prompt_tokens.size() / r.prefill_seconds : 0;
  const double tg_tps = r.decode_seconds > 0 ? r.decode_steps / r.decode_seconds : 0;
  if (a.json) {
    nlohmann::json j;
    j["prompt"] = a.prompt;
    j["prompt_tokens"] = r.prompt_tokens;
    j["tokens"] = r.tokens;
    j["text"] = r.text;
    j["finish_reason"] = r.finish_reason;
    j["prefill_tokens_per_s"] = pp_tps;
    j["decode_tokens_per_s"] = tg_tps;
    j["model"] = l.model->path();
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr, "\n[%zu prompt tokens, %.1f tok/s prefill; %zu generated, %.1f tok/s decode; %s]\n",
                 r.prompt_tokens.size(), pp_tps, r.tokens.size(), tg_tps, r.finish_reason.c_str());
  }
  return 0;
}
}  // namespace

void add_generate(CLI::App& app, Runner& run) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* c = app.add_subcommand("generate", "Generate text from a prompt on the command line");
  add_model_args(c, a->m);
  c->add_option("-p,--prompt", a->prompt, "Prompt text")->capture_default_str();
  c->add_option("-n,--n-predict", a->n, "Maximum tokens to generate")->capture_default_str()->check(CLI::Range(0, 1 << 24));
  c->add_option("--temp", a->temp, "Temperature (0 = greedy)")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  c->add_option("--top-k", a->top_k, "Top-k (0 or -1 = off)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 24));
  c->add_option("--top-p", a->top_p, "Top-p (1 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  c->add_option("--min-p", a->min_p, "Min-p (0 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  c->add_option("--repeat-penalty", a->repeat_penalty, "Repetition penalty (1 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 10.0));  // the server's repetition_penalty range
  c->add_option("-s,--seed", a->seed, "Sampling seed (default: random)");
  c->add_option("-c,--ctx", a->ctx, "Context size (default: the model's)")->check(CLI::Range(0, 1 << 22));
  c->add_option("--stop", a->stop, "Stop string (repeatable)");
  add_kv_args(c, a->kv);
  add_window_args(c, a->window);
  c->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-sequence tokens");
  c->add_flag("--json", a->json, "Print one JSON object: prompt_tokens, tokens, text, speeds");
  c->callback([a, &run] { run = [a] { return run_generate(*a); }; });
}

}  // namespace kvs::cli
