// Random-weight GGUF models and llama2.c -> GGUF conversion. Tensors are
// streamed row by row through GgufWriter::add_tensor_rows, so even a 1.1B
// model only ever holds one row of floats and the writer's I/O buffer.
#include "tools/make_model.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "model/gguf_writer.h"
#include "model/model.h"
#include "tokenizer/pre_type.h"
#include "tools/byte_vocab.h"
#include "tools/make_model_arch.h"
#include "tools/make_model_moe.h"

namespace kvs {

namespace {

// splitmix64: seeds each tensor's stream independently of the others, so a
// tensor's values depend only on (seed, tensor name), not on write order.
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Fast approximately-normal generator: the sum of 4 uniforms (Irwin-Hall)
// has the right mean/variance and bounded tails, good enough for random
// weights and ~10x faster than std::normal_distribution at 1e9 samples.
class NormalIsh {
 public:
  explicit NormalIsh(uint64_t seed) : s_(seed) {}
  float operator()() {
    const uint64_t a = splitmix(s_), b = splitmix(s_);
    const float u = (static_cast<float>(a >> 40) + static_cast<float>((a >> 16) & 0xFFFFFF) +
                     static_cast<float>(b >> 40) + static_cast<float>((b >> 16) & 0xFFFFFF)) *
                    (1.0f / 16777216.f);
    return (u - 2.0f) * 1.7320508f;  // var(sum of 4 U(0,1)) = 1/3 -> scale to 1
  }

 private:
  uint64_t s_;
};

uint32_t file_type_of(GgmlType t) {
  switch (t) {  // llama.cpp's llama_ftype numbering
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q4_1: return 3;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q5_0: return 8;
    case GgmlType::Q5_1: return 9;
    case GgmlType::Q4_K: return 15;
    case GgmlType::Q5_K: return 17;
    case GgmlType::Q6_K: return 18;
    case GgmlType::BF16: return 32;
    case GgmlType::MXFP4: return 38;
    default: return 0;
  }
}

// A matrix whose rows do not split into `t`'s blocks is stored as F16 (as
// llama.cpp's quantizer falls back): a note per tensor with progress on,
// else one note for the file (`said`), never silently.
GgmlType type_for_cols(GgmlType t, int64_t cols, const std::string& name, bool verbose, bool* said = nullptr) {
  if (cols % type_traits(t).block_elems == 0) return t;
  if (verbose)
    std::fprintf(stderr, "note: %s: row length %lld is not a multiple of the %s block (%d); stored as F16\n",
                 name.c_str(), static_cast<long long>(cols), type_name(t).c_str(), type_traits(t).block_elems);
  else if (said && !*said)
    std::fprintf(stderr, "note: matrices whose rows are not a multiple of the %s block (%d), %s first, are stored "
                 "as F16; give --dim / --ffn multiples of %d for a file all %s\n",
                 type_name(t).c_str(), type_traits(t).block_elems, name.c_str(), type_traits(t).block_elems,
                 type_name(t).c_str());
  if (said) *said = true;
  return GgmlType::F16;
}

void check_writable(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
    case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
    case GgmlType::Q6_K: case GgmlType::MXFP4:
      return;
    default:
      throw std::invalid_argument("tensor type " + type_name(t) +
                                  " is not supported for writing (use f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, "
                                  "q5_1, q4_k, q5_k, q6_k or mxfp4)");
  }
}

void set_vocab(GgufWriter& w, const Vocab& v) {
  w.set_str("tokenizer.ggml.model", v.kind == VocabKind::Gpt2 ? "gpt2" : "llama");
  if (!v.pre.empty()) w.set_str("tokenizer.ggml.pre", v.pre);
  w.set_str_array("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w.set_f32_array("tokenizer.ggml.scores", v.scores);
  if (!v.types.empty()) w.set_i32_array("tokenizer.ggml.token_type", v.types);
  if (!v.merges.empty()) w.set_str_array("tokenizer.ggml.merges", v.merges);
  if (v.bos >= 0) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos));
  if (v.eos >= 0) w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos));
  if (v.unk >= 0) w.set_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(v.unk));
  if (v.pad >= 0) w.set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(v.pad));
  w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", v.add_eos);
}

// The keys every architecture has, as llama.cpp writes them.
void set_arch(GgufWriter& w, const std::string& arch, const std::string& name, int n_ctx, int dim, int layers,
              int ffn, int heads, int kv_heads, int n_rot, float theta, float eps, GgmlType type) {
  const std::string a = arch + ".";
  w.set_str("general.architecture", arch);
  w.set_str("general.name", name);
  w.set_u32("general.file_type", file_type_of(type));
  if (type_traits(type).block_elems > 1) w.set_u32("general.quantization_version", 2);
  w.set_u32(a + "context_length", static_cast<uint32_t>(n_ctx));
  w.set_u32(a + "embedding_length", static_cast<uint32_t>(dim));
  w.set_u32(a + "block_count", static_cast<uint32_t>(layers));
  w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(ffn));
  w.set_u32(a + "attention.head_count", static_cast<uint32_t>(heads));
  w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(kv_heads));
  if (n_rot > 0) w.set_u32(a + "rope.dimension_count", static_cast<uint32_t>(n_rot));
  w.set_f32(a + "rope.freq_base", theta);
  w.set_f32(a + "attention.layer_norm_rms_epsilon", eps);
}

void progress_to_stderr(GgufWriter& w, bool on) {
  if (!on) return;
  // One updating line on a terminal, one line per tensor in a log.
  const bool tty = isatty(STDERR_FILENO) != 0;
  w.on_progress([tty](size_t i, size_t n, const std::string& name) {
    std::fprintf(stderr, tty ? "\r[%zu/%zu] %-32s" : "[%zu/%zu] %s\n", i, n, name.c_str());
    if (tty && i == n) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  });
}

// Seeded random values: each tensor's stream depends only on (seed, name).
// Matrices are N(0, stddev); norm weights are 1 for the two architectures
// whose generated files predate the others (their bytes stay as they were),
// else 1 + N(0, 0.1), so that a norm applied wrongly shows in the output.
TensorSource random_source(GgufWriter& w, const MakeModelOptions& o) {
  const uint64_t seed = o.seed;
  const bool unit_norms = o.arch == "llama" || o.arch == "qwen2";
  TensorSource s;
  auto said = std::make_shared<bool>(false);  // the F16 fallback was noted
  s.matrix = [&w, &o, seed, said](const std::string& tn, int64_t rows, int64_t cols, float stddev) {
    auto rng = std::make_shared<NormalIsh>(seed ^ name_hash(tn));
    w.add_tensor_rows(tn, type_for_cols(o.type, cols, tn, o.progress, said.get()), {cols, rows},
                      [rng, cols, stddev](int64_t, float* out) {
                        for (int64_t i = 0; i < cols; ++i) out[i] = (*rng)() * stddev;
                      });
  };
  s.tensor = [&w, &o, seed, said](const std::string& tn, const std::vector<int64_t>& dims, float stddev, GgmlType t) {
    auto rng = std::make_shared<NormalIsh>(seed ^ name_hash(tn));
    const int64_t cols = dims[0];
    w.add_tensor_rows(tn, type_for_cols(t, cols, tn, o.progress, said.get()), dims, [rng, cols, stddev](int64_t, float* out) {
      for (int64_t i = 0; i < cols; ++i) out[i] = (*rng)() * stddev;
    });
  };
  s.values = [&w](const std::string& tn, const std::vector<float>& v) {
    w.add_tensor_f32(tn, GgmlType::F32, {int64_t(v.size())}, v.data());
  };
  s.norm = [&w, seed, unit_norms](const std::string& tn, int64_t n) {
    NormalIsh rng(seed ^ name_hash(tn));
    std::vector<float> v(static_cast<size_t>(n), 1.f);
    if (!unit_norms)
      for (auto& x : v) x += rng() * 0.1f;
    w.add_tensor_f32(tn, GgmlType::F32, {n}, v.data());
  };
  s.bias = [&w, seed](const std::string& tn, int64_t n) {
    NormalIsh rng(seed ^ name_hash(tn));
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = rng() * 0.1f;
    w.add_tensor_f32(tn, GgmlType::F32, {n}, v.data());
  };
  return s;
}

}  // namespace

GgmlType parse_tensor_type(const std::string& s) {
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, GgmlType> kNames[] = {
      {"f32", GgmlType::F32},   {"f16", GgmlType::F16},   {"bf16", GgmlType::BF16}, {"q8_0", GgmlType::Q8_0},
      {"q4_0", GgmlType::Q4_0}, {"q4_1", GgmlType::Q4_1}, {"q5_0", GgmlType::Q5_0}, {"q5_1", GgmlType::Q5_1},
      {"q4_k", GgmlType::Q4_K}, {"q5_k", GgmlType::Q5_K}, {"q6_k", GgmlType::Q6_K}, {"mxfp4", GgmlType::MXFP4},
  };
  for (const auto& [n, t] : kNames)
    if (l == n) return t;
  throw std::invalid_argument("unknown tensor type '" + s +
                              "' (use f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k or mxfp4)");
}

void apply_model_preset(const std::string& preset, MakeModelOptions& o) {
  if (preset == "tiny") {
    o.dim = 64, o.n_layers = 2, o.n_heads = 4, o.n_kv_heads = 2, o.ffn_dim = 192, o.n_vocab = 512, o.n_ctx = 512;
  } else if (preset == "1.1b") {
    o.dim = 2048, o.n_layers = 16, o.n_heads = 32, o.n_kv_heads = 8, o.ffn_dim = 8192, o.n_vocab = 32000,
    o.n_ctx = 2048;
  } else {
    throw std::invalid_argument("unknown model preset '" + preset + "' (known: tiny, 1.1b)");
  }
}

void make_random_model(const MakeModelOptions& given) {
  if (given.out.empty()) throw std::invalid_argument("make-model: no output path");
  const MakeModelOptions o = resolve_arch_options(given);
  check_writable(o.type);
  if (o.arch == "gemma2" && o.n_layers != 26 && o.n_layers != 42 && o.n_layers != 46 && o.progress)
    std::fprintf(stderr, "note: llama.cpp and ik_llama.cpp run gemma2 files only with 26, 42 or 46 layers\n");
  if (!o.tokenizer_pre.empty() && !find_pre_type(o.tokenizer_pre))
    throw std::invalid_argument("make-model: unknown --tokenizer-pre '" + o.tokenizer_pre + "' (known: " +
                                known_pre_types() + ")");
  if (!o.tokenizer_pre.empty() && o.vocab_from.empty())
    throw std::invalid_argument("make-model: --tokenizer-pre needs --vocab-from");

  GgufWriter w;
  Vocab vocab;
  std::unique_ptr<GgufFile> src;
  int n_vocab = o.n_vocab;
  if (!o.vocab_from.empty()) {
    src = GgufFile::open(o.vocab_from);
    const GgufValue* toks = src->find("tokenizer.ggml.tokens");
    if (!toks || !toks->is_array())
      throw ModelError(o.vocab_from + ": key 'tokenizer.ggml.tokens' is missing (no vocabulary to copy)");
    n_vocab = static_cast<int>(toks->as_arr().size());
    if (!o.tokenizer_pre.empty()) {
      const GgufValue* model = src->find("tokenizer.ggml.model");
      if (!model || !model->is_string() || model->as_str() != "gpt2")
        throw std::invalid_argument("make-model: --tokenizer-pre needs a gpt2 (byte-level BPE) vocabulary; " +
                                    o.vocab_from + " has none");
    }
  } else {
    vocab = builtin_byte_vocab(n_vocab);
  }
  // A name containing "phi3" makes llama.cpp mark Phi-3's own special
  // tokens, which another vocabulary lacks (it fails to load): "phi" then.
  const std::string tag = o.arch == "phi3" ? "phi" : o.arch;
  const std::string name = o.name.empty() ? "random-" + tag + "-" + std::to_string(o.dim) + "x" +
                                                std::to_string(o.n_layers)
                                          : o.name;
  // rope.dimension_count as the converters write it: llama-like and phi3.
  const bool n_rot_key = o.arch == "llama" || o.arch == "mistral" || o.arch == "phi3";
  set_arch(w, o.arch, name, o.n_ctx, o.dim, o.n_layers, o.ffn_dim, o.n_heads, o.n_kv_heads, n_rot_key ? o.head_dim : 0,
           o.rope_theta, o.rms_eps, o.type);
  write_arch_keys(w, o, name);
  if (moe_model(o)) set_moe_keys(w, o);
  if (src) {
    for (const auto& [k, v] : src->metadata())
      if (k.rfind("tokenizer.", 0) == 0) w.set_value(k, v);  // verbatim, every type
    if (!o.tokenizer_pre.empty()) w.set_str("tokenizer.ggml.pre", o.tokenizer_pre);
  } else {
    set_vocab(w, vocab);
  }
  write_arch_tensors(o, n_vocab, random_source(w, o));
  progress_to_stderr(w, o.progress);
  w.write(o.out);
  if (o.progress) std::fprintf(stderr, "wrote %s\n", o.out.c_str());
}

void convert_llama2c(const std::string& bin, const std::string& tok, const std::string& out_gguf, GgmlType type) {
  check_writable(type);
  auto model = Model::load(bin, tok);
  if (model->gguf_) throw std::invalid_argument("convert: " + bin + " is already a GGUF file");
  const ModelConfig& c = model->config();
  const ModelWeights& mw = model->weights();
  GgufWriter w;
  set_arch(w, "llama", c.name, c.n_ctx_train, c.dim, c.n_layers, c.ffn_dim, c.n_heads, c.n_kv_heads, c.n_rot,
           c.rope_theta, c.rms_eps, type);
  set_vocab(w, model->vocab());

  // Views of a llama2.c model are F32 rows in owned memory: stream them out.
  auto matrix = [&](const std::string& tn, const WeightView& v) {
    const GgmlType t = type_for_cols(type, v.cols, tn, true);
    w.add_tensor_rows(tn, t, {v.cols, v.rows}, [v](int64_t r, float* out) {
      dequantize_row(v.type, v.row(r), out, v.cols);
    });
  };
  auto vec = [&](const std::string& tn, const float* p, int64_t n) { w.add_tensor_f32(tn, GgmlType::F32, {n}, p); };
  matrix("token_embd.weight", mw.tok_embd);
  vec("output_norm.weight", mw.output_norm, c.dim);
  if (!c.tied_output) matrix("output.weight", mw.output);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const LayerWeights& L = mw.layers[l];
    vec(p + "attn_norm.weight", L.attn_norm, c.dim);
    matrix(p + "attn_q.weight", L.wq);
    matrix(p + "attn_k.weight", L.wk);
    matrix(p + "attn_v.weight", L.wv);
    matrix(p + "attn_output.weight", L.wo);
    vec(p + "ffn_norm.weight", L.ffn_norm, c.dim);
    matrix(p + "ffn_gate.weight", L.w_gate);
    matrix(p + "ffn_up.weight", L.w_up);
    matrix(p + "ffn_down.weight", L.w_down);
  }
  w.write(out_gguf);
}

}  // namespace kvs
