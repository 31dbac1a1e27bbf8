#include "cli/common.h"

#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>

#include "tools/default_model.h"
#include "tools/kernel_choice.h"
#include "tools/progress.h"

namespace kvs::cli {

void add_model_args(CLI::App* cmd, ModelArgs& a) {
  cmd->add_option("-m,--model", a.model,
                  "Model file: GGUF, or llama2.c .bin (default: ../shared stories260K, else a generated "
                  "random model)");
  cmd->add_option("--tokenizer", a.tokenizer, "llama2.c tokenizer file for .bin models (default: tok512.bin beside it)");
  cmd->add_option("-t,--threads", a.threads, "Compute threads (default: one per core)")->check(CLI::Range(0, 1024));
  cmd->add_option("--prefill-precision", a.precision,
                  "Products with float (F32/F16/BF16) weights: fp32 (exact, the same bits on every machine) or bf16 "
                  "(AMX-BF16 tiles: weights and activations rounded to bfloat16, much faster prefill, slightly "
                  "different results; every product of those weights, decode too, so output stays independent "
                  "of batching), and any model's attention too, where head_dim is a multiple of 16. "
                  "Quantized weights' matmuls are exact either way. bf16 needs a CPU with amx_bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
}

void add_kv_args(CLI::App* cmd, KvArgs& a) {
  cmd->add_option("--kv-type", a.type, "KV cache element type: f32, f16, bf16, int8, int4")->capture_default_str();
  cmd->add_option("--kv-key-scale", a.key_scale,
                  "int8/int4 keys: one scale per channel over a token group (KIVI) or per token")
      ->capture_default_str();
  cmd->add_option("--kv-residual", a.residual,
                  "int8/int4: tokens per key group, kept in full precision until the group is complete; must divide "
                  "the block size (default: the block size)")
      ->check(CLI::Range(0, 256));
  cmd->add_option("--kv-group", a.group, "int8/int4: row elements sharing one scale in per-token quantization")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
}

KvCacheOptions KvArgs::options() const {
  KvCacheOptions o;
  o.type = parse_kv_type(type);
  o.key_scale = parse_key_scale(key_scale);
  o.residual = residual;
  o.group_channels = group;
  // The quantization knobs mean nothing to a float cache: refuse rather than
  // run something other than what was asked for. (Their defaults pass.)
  if (o.type != KvType::Int8 && o.type != KvType::Int4) {
    std::string given;
    if (residual != KvArgs{}.residual) given += " --kv-residual";
    if (group != KvArgs{}.group) given += " --kv-group";
    if (key_scale != KvArgs{}.key_scale) given += " --kv-key-scale";
    if (!given.empty())
      throw std::invalid_argument("--kv-type " + type + " is not quantized, so" + given +
                                  " would be ignored: give --kv-type int8 or int4, or drop them");
  }
  return o;
}

void add_window_args(CLI::App* cmd, WindowArgs& a) {
  cmd->add_option("--kv-window", a.window, "Keep each sequence's last W tokens visible (StreamingLLM window)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--kv-sinks", a.sinks, "With --kv-window: also keep the first S tokens (attention sinks)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--ctx-shift", a.shift_ctx, "llama.cpp-style context shift over a cache of C tokens")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--n-keep", a.n_keep, "With --ctx-shift: tokens kept at the start")->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--kv-text-positions", a.text_positions,
                "With --kv-window: keep original text positions (naive dropping, for comparison)");
}

WindowPolicy WindowArgs::policy() const {
  if (shift_ctx > 0 && window > 0) throw std::invalid_argument("give --kv-window or --ctx-shift, not both");
  WindowPolicy p;
  if (shift_ctx > 0) p = WindowPolicy::context_shift(shift_ctx, n_keep);
  else if (window > 0) p = WindowPolicy::streaming(window, sinks, text_positions);
  else if (sinks > 0) throw std::invalid_argument("--kv-sinks needs --kv-window");
  else if (n_keep > 0) throw std::invalid_argument("--n-keep needs --ctx-shift");
  if (text_positions && window == 0) throw std::invalid_argument("--kv-text-positions needs --kv-window");
  p.validate();
  return p;
}

std::string read_text_file(const std::string& path) {
  // A directory opens as a stream and reads as empty (or throws library
  // text): name it instead.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error("text file '" + path + "' is a directory; give the path of a text file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open text file '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw std::runtime_error("cannot read text file '" + path + "'");
  return ss.str();
}

// Whether the file starts with the GGUF magic (a missing file: no; loading
// it reports that).
static bool is_gguf(const std::string& path) {
  char magic[4] = {};
  std::ifstream f(path, std::ios::binary);
  return f.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

Loaded load_all(const ModelArgs& a, int n_ctx, bool warn_trained) {
  Loaded l;
  // This machine's decode kernel variants, from its `kvserve probe` profile.
  static const bool applied = [] {
    const std::string note = tools::apply_default_profile_choices();
    if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
    return true;
  }();
  (void)applied;
  const std::string path = resolve_model_path(a.model);
  if (!a.tokenizer.empty() && is_gguf(path))
    throw std::invalid_argument("--tokenizer is for llama2.c .bin models; " + path +
                                " is a GGUF model and brings its own vocabulary (drop --tokenizer)");
  {
    // Per matrix as the load-time copies finish (on a terminal only).
    std::mutex mu;
    std::unique_ptr<tools::Progress> bar;
    l.model = Model::load(
        path, a.tokenizer,
        [&](int64_t done, int64_t total) {
          std::lock_guard lk(mu);
          if (!bar) bar = std::make_unique<tools::Progress>("repack", total);
          bar->update(done);
        },
        parse_precision(a.precision));
  }
  if (a.precision == "bf16" && !l.model->bf16_matmuls())
    std::fprintf(stderr, "--prefill-precision bf16: this model has no float weight matrices, so its matmuls stay exact; %s\n",
                 l.model->bf16_attention() ? "its attention runs on the bf16 tiles"
                                           : "so does its attention (head_dim is no multiple of 16)");
  const int trained = l.model->config().n_ctx_train;
  if (warn_trained && trained > 0 && n_ctx > trained)
    std::fprintf(stderr,
                 "kvserve: warning: context %d tokens is beyond the model's trained context of %d; "
                 "text past it may degrade\n",
                 n_ctx, trained);
  l.tok = Tokenizer::create(l.model->vocab());
  EngineOptions eo;
  eo.n_threads = a.threads;
  eo.n_ctx = n_ctx;
  l.engine = std::make_unique<Engine>(l.model, eo);
  return l;
}

namespace {

bool whole_number(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

std::string bound(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

}  // namespace

void refuse_non_finite(CLI::App& app) {
  static const CLI::Validator finite(
      [](std::string& in) {
        double v = 0;
        if (whole_number(in, &v) && !std::isfinite(v)) return "'" + in + "' is not a finite number";
        return std::string();
      },
      "");
  for (CLI::Option* o : app.get_options())
    if (o->get_type_name().rfind("FLOAT", 0) == 0) o->check(finite);  // "FLOAT:<a range>"
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_non_finite(*sub);
}

std::string explain_parse_error(const std::string& what) {
  static const std::regex kRange(R"(^(.*)Value (.*) not in range (\S+) to (\S+)$)");
  std::smatch m;
  if (!std::regex_match(what, m, kRange)) return what;
  const std::string opt = m[1], value = m[2];
  double v = 0, lo = 0, hi = 0;
  if (!whole_number(value, &v)) return opt + "'" + value + "' is not a number";
  if (!whole_number(m[3], &lo) || !whole_number(m[4], &hi)) return what;
  const bool open_top = hi > 1e300;
  // CLI11's PositiveNumber prints its least bound (the smallest double) as 0.
  if (open_top && v >= lo && v <= 0) return opt + value + " is out of range: it must be greater than 0";
  if (open_top) return opt + value + " is out of range: it must be at least " + bound(lo);
  return opt + value + " is out of range: it must be between " + bound(lo) + " and " + bound(hi);
}

}  // namespace kvs::cli
