// kvserve entry point: parses the subcommand and runs it. Every error that
// reaches here is printed as one clear line and gives a non-zero exit.
#include <cstdio>
#include <exception>
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvserve: a KV-cache-centric LLM inference server (GGUF / llama2.c models)"};
  app.require_subcommand(1);
  kvs::cli::Runner run;
  kvs::cli::add_generate(app, run);
  kvs::cli::add_tokenize(app, run);
  kvs::cli::add_perplexity(app, run);
  kvs::cli::add_eval(app, run);
  kvs::cli::add_bench(app, run);
  kvs::cli::add_make_model(app, run);
  kvs::cli::add_convert(app, run);
  kvs::cli::add_plan(app, run);
  kvs::cli::add_probe(app, run);
  kvs::cli::add_kv(app, run);
  kvs::cli::add_batched_bench(app, run);
  kvs::cli::add_serve(app, run);
  kvs::cli::add_router(app, run);
  kvs::cli::add_chat(app, run);
  kvs::cli::add_wipe(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run ? run() : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvserve: error: %s\n", e.what());
    return 1;
  }
}
