#include "cli/common.h"

#include "tools/default_model.h"

namespace kvs::cli {

void add_model_args(CLI::App* cmd, ModelArgs& a) {
  cmd->add_option("-m,--model", a.model,
                  "Model file: GGUF, or llama2.c .bin (default: ../shared stories260K, else a generated "
                  "random model)");
  cmd->add_option("--tokenizer", a.tokenizer, "llama2.c tokenizer file for .bin models (default: tok512.bin beside it)");
  cmd->add_option("-t,--threads", a.threads, "Compute threads (default: one per core)")->check(CLI::Range(0, 1024));
}

Loaded load_all(const ModelArgs& a) {
  Loaded l;
  l.model = Model::load(resolve_model_path(a.model), a.tokenizer);
  l.tok = Tokenizer::create(l.model->vocab());
  EngineOptions eo;
  eo.n_threads = a.threads;
  l.engine = std::make_unique<Engine>(l.model, eo);
  return l;
}

}  // namespace kvs::cli
