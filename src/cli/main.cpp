// kvserve entry point: parses the subcommand and runs it. Every error that
// reaches here is printed as one clear line and gives a non-zero exit.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include "cli/commands.h"
#include "cli/common.h"

// The kernels ignore a KVS_ISA they do not know (kernels/cpu.cpp): say so,
// or a mistyped override silently benchmarks the wrong code path.
static void warn_unknown_isa() {
  const char* isa = std::getenv("KVS_ISA");
  if (!isa) return;
  for (const char* known : {"scalar", "avx2", "avx512", "amx"})
    if (std::strcmp(isa, known) == 0) return;
  std::fprintf(stderr,
               "kvserve: warning: KVS_ISA=%s is not one of scalar, avx2, avx512, amx; ignored (the CPU's best is "
               "used)\n",
               isa);
}

int main(int argc, char** argv) {
  warn_unknown_isa();
  CLI::App app{"kvserve: a KV-cache-centric LLM inference server (GGUF / llama2.c models)"};
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return kvs::cli::explain_parse_error(e.what()) + "\nRun with --help for more information.\n";
  });
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
  kvs::cli::refuse_non_finite(app);
  // CLI11 says only "A subcommand is required" for a mistyped one: name it.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    std::string names;
    bool known = false;
    const std::function<bool(const CLI::App*)> all = [](const CLI::App*) { return true; };
    for (const CLI::App* s : std::as_const(app).get_subcommands(all)) {
      known |= s->check_name(word);
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "kvserve: unknown command '%s'; the commands are %s (kvserve --help)\n", word.c_str(),
                   names.c_str());
      return int(CLI::ExitCodes::ExtrasError);
    }
  }
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
