// Options and loading shared by the model-running subcommands.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include "engine/kv_cache.h"
#include "kv/window_policy.h"
#include "kvserve/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace kvs::cli {

struct ModelArgs {
  std::string model;      // empty: default model (see resolve_model_path)
  std::string tokenizer;  // llama2.c tokenizer file for .bin models
  int threads = 0;        // 0 = one per core
  std::string precision = "fp32";  // --prefill-precision: MatmulPrecision of float weights
};

void add_model_args(CLI::App* cmd, ModelArgs& a);

// The KV cache's element type and quantization (--kv-type, --kv-key-scale,
// --kv-residual, --kv-group).
struct KvArgs {
  std::string type = "f32";
  std::string key_scale = "channel";
  int residual = 0;
  int group = 32;
  KvCacheOptions options() const;  // throws std::invalid_argument on a bad spelling
};
void add_kv_args(CLI::App* cmd, KvArgs& a);

// A window policy bounding each sequence's KV (--kv-window/--kv-sinks, or
// --ctx-shift/--n-keep).
struct WindowArgs {
  int window = 0, sinks = 0, shift_ctx = 0, n_keep = 0;
  bool text_positions = false;
  WindowPolicy policy() const;  // throws std::invalid_argument on a bad combination
};
void add_window_args(CLI::App* cmd, WindowArgs& a);

struct Loaded {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Engine> engine;
};
// Whole file as bytes; throws std::runtime_error naming the path.
std::string read_text_file(const std::string& path);

// CLI11's parse error, said for a person: a word where a number belongs is
// "not a number" (CLI11 says "not in range"), and a bound is said as a
// bound, not as the largest double written out.
std::string explain_parse_error(const std::string& what);

// Every number option of `app` and its commands refuses nan and inf
// (CLI11's ranges let nan through: every comparison with it is false).
void refuse_non_finite(CLI::App& app);

// Resolves the default model, loads model + tokenizer, builds the engine.
// n_ctx: the longest sequence the command runs (EngineOptions::n_ctx; 0 =
// the model's training context).
// A context past the model's trained one gets a warning on stderr
// (warn_trained false: the caller warns about the context it settles on).
Loaded load_all(const ModelArgs& a, int n_ctx = 0, bool warn_trained = true);

}  // namespace kvs::cli
