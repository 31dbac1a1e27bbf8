// `kvserve make-model`: writes a random-weight GGUF of a chosen shape and
// tensor type (benchmarks and tests), with a built-in byte-level vocabulary
// or one copied from another GGUF.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "tools/kv_memory.h"
#include "tools/make_model.h"
#include "tools/make_model_arch.h"

namespace kvs::cli {

namespace {

struct MakeModelArgs {
  MakeModelOptions o;
  std::string preset, type = "q8_0", expert_type;
  bool quiet = false;
};

// What a shape costs before anything is written: the file's bytes, and the
// bytes held in memory until the write (F32 norms, biases and values, the
// built-in vocabulary; the matrices stream row by row). Doubles: an absurd
// shape must not overflow the estimate meant to refuse it.
struct SizeEstimate {
  double file = 0, resident = 0;
};

SizeEstimate estimate_size(const MakeModelOptions& given) {
  const MakeModelOptions o = resolve_arch_options(given);  // a bad shape fails here as it would in the writer
  int n_vocab = o.n_vocab;
  if (!o.vocab_from.empty()) {
    const auto src = GgufFile::open(o.vocab_from);
    if (const GgufValue* t = src->find("tokenizer.ggml.tokens"); t && t->is_array()) n_vocab = int(t->as_arr().size());
  }
  SizeEstimate e;
  auto rows = [&e](GgmlType t, double n_rows, int64_t cols) {
    const TypeTraits& tt = type_traits(t);
    // Rows that do not fill whole blocks are written as F16 (make_model.cpp).
    const double per_row = cols % tt.block_elems == 0 ? double(cols / tt.block_elems) * double(tt.block_bytes)
                                                      : 2.0 * double(cols);
    e.file += per_row * n_rows;
  };
  auto f32 = [&e](double n) {
    e.file += 4 * n;
    e.resident += 4 * n;
  };
  TensorSource s;
  s.matrix = [&](const std::string&, int64_t r, int64_t c, float) { rows(o.type, double(r), c); };
  s.tensor = [&](const std::string&, const std::vector<int64_t>& dims, float, GgmlType t) {
    double r = 1;
    for (size_t i = 1; i < dims.size(); ++i) r *= double(dims[i]);
    rows(t, r, dims[0]);
  };
  s.norm = [&](const std::string&, int64_t n) { f32(double(n)); };
  s.bias = [&](const std::string&, int64_t n) { f32(double(n)); };
  s.values = [&](const std::string&, const std::vector<float>& v) { f32(double(v.size())); };
  write_arch_tensors(o, n_vocab, s);
  if (o.vocab_from.empty()) e.resident += 64.0 * n_vocab;  // a piece, a score and a type per token
  return e;
}

std::string gib(double bytes) {
  char b[48];
  const double g = bytes / (1024.0 * 1024 * 1024);
  if (g < 1024) std::snprintf(b, sizeof b, "%.1f GiB", g);
  else std::snprintf(b, sizeof b, "%.3g TiB", g / 1024);
  return b;
}

// Refuses, before any allocation, a shape whose file would not fit on the
// output's disk or whose in-memory tensors would not fit in available memory.
void check_fits(const MakeModelOptions& o) {
  const SizeEstimate e = estimate_size(o);
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute(o.out).parent_path();
  std::error_code ec;
  const fs::space_info disk = fs::space(dir, ec);
  if (!ec && e.file > double(disk.available))
    throw std::invalid_argument("make-model: this shape makes a file of about " + gib(e.file) + ", more than the " +
                                gib(double(disk.available)) + " free in " + dir.string() +
                                "; choose a smaller --dim, --layers, --ffn, --vocab or --experts");
  double avail = 0;
  try {
    avail = double(tools::available_memory_bytes());
  } catch (const std::exception&) {
    return;  // no /proc/meminfo: the disk check is all we can do
  }
  if (e.resident > 0.8 * avail)
    throw std::invalid_argument("make-model: this shape holds about " + gib(e.resident) +
                                " of norms, biases and vocabulary in memory while writing, more than the " +
                                gib(avail) + " available; choose a smaller --dim, --layers or --vocab");
}

}  // namespace

void add_make_model(CLI::App& app, Runner& run) {
  auto a = std::make_shared<MakeModelArgs>();
  CLI::App* c = app.add_subcommand(
      "make-model",
      "Write a GGUF model with seeded random weights (chosen shape and tensor type) for benchmarks and tests");
  MakeModelOptions& o = a->o;
  c->add_option("-o,--out", o.out, "Output .gguf path")->required();
  c->add_option("--preset", a->preset, "Start from a named shape: tiny (dim 64, 2 layers) or 1.1b (dim 2048, 16 layers, "
                                       "32 heads, 8 KV heads, ffn 8192, vocab 32000); other options override it")
      ->check(CLI::IsMember({"tiny", "1.1b"}));
  c->add_option("--arch", o.arch,
                "Architecture: llama, mistral, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, phi3 or gpt-oss (the "
                "keys and tensors llama.cpp / ik_llama.cpp expect of each; qwen2moe / qwen3moe: their attention with "
                "experts; gpt-oss: head dim 64, learned sinks, window on even layers, YaRN x32, MXFP4 experts)")
      ->capture_default_str()
      ->check(CLI::IsMember(
          {"llama", "mistral", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "gpt-oss"}));
  // Shape options remember whether they were given, so a preset only fills the rest.
  auto* dim = c->add_option("--dim", o.dim, "Embedding width")->capture_default_str();
  auto* layers = c->add_option("--layers", o.n_layers, "Number of transformer blocks")->capture_default_str();
  auto* heads = c->add_option("--heads", o.n_heads, "Attention heads (head dim = dim / heads)")->capture_default_str();
  auto* kv = c->add_option("--kv-heads", o.n_kv_heads, "KV heads (must divide heads; < heads is GQA)")->capture_default_str();
  auto* ffn = c->add_option("--ffn", o.ffn_dim, "Feed-forward (SwiGLU) width")->capture_default_str();
  auto* vocab = c->add_option("--vocab", o.n_vocab, "Vocabulary size for the built-in vocabulary (>= 259)")->capture_default_str();
  auto* ctx = c->add_option("--ctx", o.n_ctx, "Training context length written to the metadata")->capture_default_str();
  c->add_option("--head-dim", o.head_dim, "Head size, attention.key_length (default dim / heads)")
      ->check(CLI::PositiveNumber);
  c->add_option("--window", o.window,
                "Sliding window: mistral and phi3 (every layer; phi3 0 = none), gemma2 and gpt-oss (even layers), "
                "gemma3 (five of six layers); defaults 4096, 0, 4096, 128, 1024")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--rope-theta", o.rope_theta, "RoPE frequency base (default 10000; gemma3 1e6, its global layers)")
      ->check(CLI::PositiveNumber);
  c->add_option("--rope-scaling", o.rope_scaling, "RoPE scaling type written to the file: linear or yarn");
  c->add_option("--rope-scale", o.rope_scale, "With --rope-scaling: the factor (>= 1)");
  c->add_option("--rope-orig-ctx", o.rope_orig_ctx,
                "Original context of YaRN or of the RoPE factors (default ctx / scale, or ctx / 4)")
      ->check(CLI::PositiveNumber);
  c->add_flag("--rope-factors", o.rope_factors,
              "Per-dimension RoPE factors: llama / mistral rope_freqs.weight (Llama 3.1's formula), phi3 LongRoPE's "
              "rope_factors_long / _short");
  c->add_option("--attn-softcap", o.attn_softcap, "gemma2: attention logit soft-cap (default 50)")
      ->check(CLI::PositiveNumber);
  c->add_option("--final-softcap", o.final_softcap, "gemma2: final logit soft-cap (default 30)")
      ->check(CLI::PositiveNumber);
  c->add_option("--rms-eps", o.rms_eps, "RMSNorm epsilon")->capture_default_str();
  c->add_option("--type", a->type, "Tensor type of the 2-D weights: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                                   "q4_k, q5_k, q6_k, mxfp4 (norms and biases are always f32; a matrix whose rows "
                                   "do not fill whole blocks stays f16, with a note)")->capture_default_str();
  c->add_option("--vocab-from", o.vocab_from, "Copy every tokenizer.* key from this GGUF (sets the vocabulary size)");
  c->add_option("--tokenizer-pre", o.tokenizer_pre,
                "With --vocab-from a gpt2 vocabulary: the tokenizer.ggml.pre to write (e.g. llama-bpe, qwen2, tekken, "
                "gpt-4o)");
  c->add_flag("--tied", o.tied, "No output.weight: the logits reuse token_embd (gemma2 / gemma3 always)");
  c->add_option("--seed", o.seed, "Random seed (same seed and shape = same file)")->capture_default_str();
  c->add_option("--name", o.name, "general.name (default random-<arch>-<dim>x<layers>)");
  c->add_option("--experts", o.n_expert,
                "Experts per layer (llama: Mixtral-style MoE; qwen2moe/qwen3moe/gpt-oss default 8)")
      ->check(CLI::Range(1, 1 << 16));  // 0 is the "default" sentinel: given, it would be silently replaced
  c->add_option("--experts-used", o.n_expert_used, "Experts each token runs (default 2; gpt-oss 4)")
      ->check(CLI::Range(1, 1 << 16));
  c->add_option("--expert-ffn", o.expert_ffn, "qwen2moe/qwen3moe/gpt-oss: each expert's width (default --ffn)");
  c->add_option("--shared-ffn", o.shared_ffn, "qwen2moe: the shared expert's width (default --ffn)");
  c->add_option("--expert-type", a->expert_type,
                "Tensor type of the experts (as --type; default: gpt-oss mxfp4, the others --type)");
  c->add_flag("-q,--quiet", a->quiet, "No progress output");
  c->callback([a, dim, layers, heads, kv, ffn, vocab, ctx, &run] {
    run = [a, dim, layers, heads, kv, ffn, vocab, ctx] {
      MakeModelOptions o = a->o;
      if (!a->preset.empty()) {
        MakeModelOptions p;
        apply_model_preset(a->preset, p);
        if (!dim->count()) o.dim = p.dim;
        if (!layers->count()) o.n_layers = p.n_layers;
        if (!heads->count()) o.n_heads = p.n_heads;
        if (!kv->count()) o.n_kv_heads = p.n_kv_heads;
        if (!ffn->count()) o.ffn_dim = p.ffn_dim;
        if (!vocab->count()) o.n_vocab = p.n_vocab;
        if (!ctx->count()) o.n_ctx = p.n_ctx;
      }
      o.type = parse_tensor_type(a->type);
      if (!a->expert_type.empty()) o.expert_type = parse_tensor_type(a->expert_type);
      o.progress = !a->quiet;
      check_fits(o);
      make_random_model(o);
      return 0;
    };
  });
}

}  // namespace kvs::cli
