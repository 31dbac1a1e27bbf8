// `kvserve perplexity`: llama.cpp-protocol perplexity of a text file.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "tools/progress.h"
#include "engine/perplexity.h"

namespace kvs::cli {

namespace {
struct PplArgs {
  ModelArgs m;
  std::string file;
  int ctx = 512;
  bool json = false;
  KvArgs kv;
};

int run_ppl(const PplArgs& a) {
  Loaded l = load_all(a.m, a.ctx);
  const Vocab& v = l.model->vocab();
  std::vector<int> toks = l.tok->encode(read_text_file(a.file), v.add_bos);
  std::fprintf(stderr, "perplexity: %zu tokens, %zu chunks of %d\n", toks.size(), toks.size() / a.ctx, a.ctx);
  tools::Progress bar("perplexity", int64_t(toks.size() / size_t(a.ctx)));
  PerplexityResult r = perplexity(*l.engine, toks, a.ctx, v.add_bos ? v.bos : -1, [&bar](int d, int n, double p) {
    char note[48];
    std::snprintf(note, sizeof note, "PPL %.4f", p);
    if (bar.enabled()) bar.update(d, note);
    else std::fprintf(stderr, "  [%d/%d] running PPL %.4f\n", d, n, p);
  }, a.kv.options());
  bar.finish();
  if (a.json) {
    nlohmann::json j{{"ppl", r.ppl}, {"nll", r.nll}, {"chunks", r.n_chunks}, {"scored_tokens", r.n_scored},
                     {"ctx", a.ctx}, {"tokens", toks.size()}, {"model", l.model->path()}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("PPL = %.4f over %lld scored tokens (%d chunks of %d)\n", r.ppl, (long long)r.n_scored,
                r.n_chunks, a.ctx);
  }
  return 0;
}
}  // namespace

void add_perplexity(CLI::App& app, Runner& run) {
  auto a = std::make_shared<PplArgs>();
  CLI::App* c = app.add_subcommand("perplexity", "Perplexity of a text file (llama.cpp protocol)");
  add_model_args(c, a->m);
  c->add_option("-f,--file", a->file, "Text file")->required()->check(CLI::ExistingFile);
  c->add_option("-c,--ctx", a->ctx, "Context per chunk")->capture_default_str()->check(CLI::Range(4, 1 << 20));
  c->add_flag("--json", a->json, "Print one JSON object with ppl");
  add_kv_args(c, a->kv);
  c->callback([a, &run] { run = [a] { return run_ppl(*a); }; });
}

}  // namespace kvs::cli
