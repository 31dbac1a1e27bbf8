// Options and loading shared by the model-running subcommands.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include "kvserve/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace kvs::cli {

struct ModelArgs {
  std::string model;      // empty: default model (see resolve_model_path)
  std::string tokenizer;  // llama2.c tokenizer file for .bin models
  int threads = 0;        // 0 = one per core
};

void add_model_args(CLI::App* cmd, ModelArgs& a);

struct Loaded {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Engine> engine;
};
// Resolves the default model, loads model + tokenizer, builds the engine.
Loaded load_all(const ModelArgs& a);

}  // namespace kvs::cli
