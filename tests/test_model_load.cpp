// Model loading: config_from_gguf, Model::load for GGUF and llama2.c files
// (the two stories260K files must agree exactly), llama2.c -> GGUF
// conversion, random-model generation, and model-level errors (unknown
// arch, missing or misshapen tensors) naming the file and the tensor/key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "engine/local_sequence.h"
#include "kernels/cpu.h"
#include "gguf_test_util.h"
#include "kvserve/engine.h"
#include "model/model.h"
#include "model/vocab_loaders.h"
#include "test_util.h"
#include "tools/make_model.h"

using namespace kvs;
using namespace kvs::test;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) { return temp_dir() + "/" + name; }

std::vector<float> rowf(const WeightView& w, int64_t r) {
  std::vector<float> out(static_cast<size_t>(w.cols));
  dequantize_row(w.type, w.row(r), out.data(), w.cols);
  return out;
}

// Every element of two weight matrices, dequantized, is identical.
void expect_same_weights(const WeightView& a, const WeightView& b, const std::string& what) {
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  for (int64_t r = 0; r < a.rows; ++r) ASSERT_EQ(rowf(a, r), rowf(b, r)) << what << " row " << r;
}

void expect_same_vec(const float* a, const float* b, int n, const std::string& what) {
  ASSERT_TRUE(a && b) << what;
  for (int i = 0; i < n; ++i) ASSERT_EQ(a[i], b[i]) << what << " [" << i << "]";
}

const std::string kStoriesGguf = "models/stories260K/stories260K.gguf";
const std::string kStoriesBin = "models/stories260K/stories260K.bin";

// A small random llama model for the error tests (written once per process).
std::string tiny_model() {
  static const std::string p = [] {
    MakeModelOptions o;
    o.out = tmp("tiny-base.gguf");
    o.type = GgmlType::F32;
    o.progress = false;
    make_random_model(o);
    return o.out;
  }();
  return p;
}

}  // namespace

// ---- config --------------------------------------------------------------------

TEST(ModelConfig, Stories260K) {
  if (!shared_available()) GTEST_SKIP();
  auto f = GgufFile::open(shared(kStoriesGguf));
  const ModelConfig c = config_from_gguf(*f);
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.n_vocab, 512);
  EXPECT_EQ(c.n_ctx_train, 512);
  EXPECT_EQ(c.ffn_dim, 172);
  EXPECT_EQ(c.n_rot, 8);
  EXPECT_EQ(c.rope_theta, 10000.f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_EQ(c.rope, RopeStyle::Normal);
  EXPECT_FALSE(c.has_qkv_bias);
  EXPECT_FALSE(c.tied_output);  // llama.cpp's converter writes output.weight
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.weight_bytes, 1171200u);
}

TEST(ModelConfig, TinyRandom) {
  if (!shared_available()) GTEST_SKIP();
  const ModelConfig q = config_from_gguf(*GgufFile::open(shared("models/tiny-random/tiny-qwen2-q4_k_m.gguf")));
  EXPECT_EQ(q.arch, "qwen2");
  EXPECT_EQ(q.rope, RopeStyle::Neox);
  EXPECT_TRUE(q.has_qkv_bias);
  EXPECT_TRUE(q.tied_output);
  EXPECT_EQ(q.n_kv_heads, 1);
  EXPECT_EQ(q.head_dim, 32);
  EXPECT_EQ(q.n_rot, 32);
  EXPECT_EQ(q.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(q.rms_eps, 1e-6f);
  EXPECT_EQ(q.n_vocab, 50257);
  EXPECT_EQ(q.name, "random-qwen2-256x4");
  const ModelConfig l = config_from_gguf(*GgufFile::open(shared("models/tiny-random/tiny-llama-f16.gguf")));
  EXPECT_EQ(l.rope, RopeStyle::Normal);
  EXPECT_TRUE(l.tied_output);
  EXPECT_EQ(l.n_kv_heads, 2);
  EXPECT_EQ(l.ffn_dim, 704);
  EXPECT_EQ(l.n_vocab, 32000);
  EXPECT_EQ(l.n_ctx_train, 2048);
}

TEST(ModelConfig, UnknownArchListsSupported) {
  if (!shared_available()) GTEST_SKIP();
  const std::string p = shared("golden/tokenizer/ggml-vocab-gpt-2.gguf");
  const std::string e = model_error([&] { config_from_gguf(*GgufFile::open(p)); });
  EXPECT_NE(e.find(p), std::string::npos) << e;
  EXPECT_NE(e.find("unsupported architecture 'gpt2'"), std::string::npos) << e;
  EXPECT_NE(e.find("llama, mistral, qwen2"), std::string::npos) << e;
  // A vocab-only llama file has the config but no weights.
  const std::string v = shared("golden/tokenizer/ggml-vocab-llama-spm.gguf");
  const std::string e2 = model_error([&] { Model::load(v); });
  EXPECT_NE(e2.find("'token_embd.weight' is missing"), std::string::npos) << e2;
}

// ---- loading the shared models -------------------------------------------------------

TEST(ModelLoad, EverySharedModel) {
  if (!shared_available()) GTEST_SKIP();
  std::set<std::string> ids;
  for (const std::string& rel : {kStoriesGguf, kStoriesBin, std::string("models/tiny-random/tiny-llama-f16.gguf"),
                                std::string("models/tiny-random/tiny-llama-q4_0.gguf"),
                                std::string("models/tiny-random/tiny-qwen2-q8_0.gguf"),
                                std::string("models/tiny-random/tiny-qwen2-q4_k_m.gguf")}) {
    SCOPED_TRACE(rel);
    auto m = Model::load(shared(rel));
    const ModelConfig& c = m->config();
    const ModelWeights& w = m->weights();
    EXPECT_EQ(static_cast<int>(m->vocab().size()), c.n_vocab);
    EXPECT_EQ(m->identity().size(), 64u);
    EXPECT_EQ(m->identity(), Model::load(shared(rel))->identity());  // stable
    ids.insert(m->identity());
    EXPECT_EQ(w.tok_embd.rows, c.n_vocab);
    EXPECT_EQ(w.tok_embd.cols, c.dim);
    EXPECT_EQ(w.output.rows, c.n_vocab);
    ASSERT_EQ(static_cast<int>(w.layers.size()), c.n_layers);
    ASSERT_NE(w.output_norm, nullptr);
    for (const LayerWeights& L : w.layers) {
      EXPECT_EQ(L.wq.rows, int64_t(c.n_heads) * c.head_dim);
      EXPECT_EQ(L.wk.rows, int64_t(c.n_kv_heads) * c.head_dim);
      EXPECT_EQ(L.wo.cols, int64_t(c.n_heads) * c.head_dim);
      EXPECT_EQ(L.w_gate.rows, c.ffn_dim);
      EXPECT_EQ(L.w_down.cols, c.ffn_dim);
      EXPECT_EQ(L.w_down.row_stride, row_bytes(L.w_down.type, c.ffn_dim));
      EXPECT_EQ(L.bq != nullptr, c.has_qkv_bias);
      EXPECT_TRUE(std::isfinite(L.attn_norm[c.dim - 1]) && std::isfinite(L.ffn_norm[0]));
      for (const WeightView* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
        auto r = rowf(*v, v->rows - 1);
        for (float x : r) ASSERT_TRUE(std::isfinite(x));
      }
    }
    if (c.tied_output) {
      EXPECT_EQ(w.output.data, w.tok_embd.data);
    }
  }
  EXPECT_EQ(ids.size(), 6u);
}

// Load-time repacking (Panel16 on AVX-512, Panel8 on AVX2) must not move a
// bit of the logits, and the file pages it releases must still serve the
// paths that read the file layout (an ISA override below the active one).
TEST(ModelLoad, RepackedWeightsGiveIdenticalLogits) {
  if (!shared_available()) GTEST_SKIP();
  for (const std::string rel : {"models/tiny-random/tiny-llama-q4_0.gguf", "models/tiny-random/tiny-qwen2-q8_0.gguf",
                                "models/tiny-random/tiny-qwen2-q4_k_m.gguf"}) {
    SCOPED_TRACE(rel);
    setenv("KVS_REPACK", "0", 1);
    auto plain = Model::load(shared(rel));
    unsetenv("KVS_REPACK");
    auto packed = Model::load(shared(rel));
    int n_packed = 0;
    size_t bytes = 0;
    for (const LayerWeights& l : packed->weights().layers)
      for (const WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        if (v->pack != PackLayout::None) {
          ++n_packed;
          bytes += packed_size(*v);
        }
    EXPECT_EQ(plain->weights().layers[0].wq.pack, PackLayout::None);
    if (active_isa() != Isa::Scalar) {
      EXPECT_GT(n_packed, 0) << "Q8_0/Q4_0/Q4_K weights are repacked on AVX-512 and AVX2";
      EXPECT_GE(packed->packed_.size(), bytes);
    }
    const std::vector<int32_t> prompt = {1, 15, 300, 7, 42, 99, 5, 250, 3, 17, 64, 128, 11, 2, 9, 77, 31};
    auto logits = [&](const std::shared_ptr<const Model>& m) {
      Engine e(m, EngineOptions{2});
      LocalSequence seq(e, 64);
      std::vector<float> all = seq.eval(prompt, /*all_logits=*/true);  // [n_prompt, n_vocab]
      for (int i = 0; i < 4; ++i) {
        std::vector<float> l = seq.eval({int32_t(20 + i)}, false);  // decode steps: n = 1 path
        all.insert(all.end(), l.begin(), l.end());
      }
      return all;
    };
    const std::vector<float> a = logits(plain), b = logits(packed);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "repacking changed the logits";
    // A path below the active one reads the file layout (the released pages).
    set_isa_override(active_isa() >= Isa::Avx512 ? Isa::Avx2 : Isa::Scalar);
    const std::vector<float> c = logits(plain), d = logits(packed);
    clear_isa_override();
    EXPECT_EQ(0, std::memcmp(c.data(), d.data(), c.size() * 4)) << "released file pages read back wrong";
  }
}

// A float model's packed copy (Panel16 on AVX-512, Panel8 on AVX2) changes
// the summation order to the k-chain (bit-exactness of that order is
// test_matmul's): its logits must stay within f32 rounding of the file
// layout's, prefill and decode, and name the same greedy tokens.
TEST(ModelLoad, PackedFloatModelMatchesTheFileLayout) {
  if (!shared_available()) GTEST_SKIP();
  if (active_isa() == Isa::Scalar) GTEST_SKIP() << "no packed layout without AVX2";
  const std::string rel = "models/tiny-random/tiny-llama-f16.gguf";
  setenv("KVS_REPACK", "0", 1);
  auto plain = Model::load(shared(rel));
  unsetenv("KVS_REPACK");
  auto packed = Model::load(shared(rel));
  ASSERT_EQ(packed->weights().layers[0].w_up.type, GgmlType::F16);
  ASSERT_EQ(packed->weights().layers[0].w_up.pack, pack_layout_for(active_isa()));
  ASSERT_EQ(plain->weights().layers[0].w_up.pack, PackLayout::None);
  const std::vector<int32_t> prompt = {1, 15, 300, 7, 42, 99, 5, 250, 3, 17, 64, 128, 11, 2, 9, 77, 31};
  auto logits = [&](const std::shared_ptr<const Model>& m) {
    Engine e(m, EngineOptions{2});
    LocalSequence seq(e, 64);
    std::vector<float> all = seq.eval(prompt, /*all_logits=*/true);  // [n_prompt, n_vocab]
    for (int i = 0; i < 4; ++i) {
      std::vector<float> l = seq.eval({int32_t(20 + i)}, false);  // decode steps: n = 1 path
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  };
  const std::vector<float> a = logits(plain), b = logits(packed);
  ASSERT_EQ(a.size(), b.size());
  const size_t vocab = size_t(plain->config().n_vocab);
  const auto [max_diff, max_abs] = test::max_diff_and_abs(a, b);
  EXPECT_GT(max_diff, 0.0) << "the packed copy should run its own order";
  EXPECT_LE(max_diff, 1e-4 * max_abs) << "max |diff| " << max_diff << " of max |logit| " << max_abs;
  for (size_t row = 0; row < a.size() / vocab; ++row) {
    auto arg = [&](const std::vector<float>& v) {
      return std::max_element(v.begin() + long(row * vocab), v.begin() + long((row + 1) * vocab)) - v.begin();
    };
    EXPECT_EQ(arg(a), arg(b)) << "row " << row;
  }
}

TEST(ModelLoad, QwenBiasesAndTypes) {
  if (!shared_available()) GTEST_SKIP();
  auto m = Model::load(shared("models/tiny-random/tiny-qwen2-q4_k_m.gguf"));
  const auto& L = m->weights().layers[0];
  EXPECT_NE(L.bq, nullptr);
  EXPECT_NE(L.bk, nullptr);
  EXPECT_NE(L.bv, nullptr);
  EXPECT_EQ(m->weights().tok_embd.type, GgmlType::Q6_K);
  EXPECT_EQ(L.wq.type, GgmlType::Q4_K);
}

// ---- llama2.c --------------------------------------------------------------------

TEST(Llama2c, Stories260KMatchesGguf) {
  if (!shared_available()) GTEST_SKIP();
  auto b = Model::load(shared(kStoriesBin));  // tokenizer: tok512.bin beside it
  auto g = Model::load(shared(kStoriesGguf));
  const ModelConfig &cb = b->config(), &cg = g->config();
  EXPECT_EQ(cb.arch, "llama");
  EXPECT_EQ(cb.dim, cg.dim);
  EXPECT_EQ(cb.n_layers, cg.n_layers);
  EXPECT_EQ(cb.n_heads, cg.n_heads);
  EXPECT_EQ(cb.n_kv_heads, cg.n_kv_heads);
  EXPECT_EQ(cb.head_dim, cg.head_dim);
  EXPECT_EQ(cb.ffn_dim, cg.ffn_dim);
  EXPECT_EQ(cb.n_vocab, cg.n_vocab);
  EXPECT_EQ(cb.n_ctx_train, cg.n_ctx_train);
  EXPECT_EQ(cb.n_rot, cg.n_rot);
  EXPECT_EQ(cb.rope_theta, cg.rope_theta);
  EXPECT_EQ(cb.rms_eps, cg.rms_eps);
  EXPECT_EQ(cb.rope, RopeStyle::Normal);
  EXPECT_TRUE(cb.tied_output);
  const ModelWeights &wb = b->weights(), &wg = g->weights();
  expect_same_weights(wb.tok_embd, wg.tok_embd, "token_embd");
  expect_same_weights(wb.output, wg.output, "output (tied in .bin)");
  expect_same_vec(wb.output_norm, wg.output_norm, cb.dim, "output_norm");
  for (int l = 0; l < cb.n_layers; ++l) {
    const LayerWeights &lb = wb.layers[l], &lg = wg.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    expect_same_weights(lb.wq, lg.wq, p + "wq");
    expect_same_weights(lb.wk, lg.wk, p + "wk");
    expect_same_weights(lb.wv, lg.wv, p + "wv");
    expect_same_weights(lb.wo, lg.wo, p + "wo");
    expect_same_weights(lb.w_gate, lg.w_gate, p + "gate");
    expect_same_weights(lb.w_up, lg.w_up, p + "up");
    expect_same_weights(lb.w_down, lg.w_down, p + "down");
    expect_same_vec(lb.attn_norm, lg.attn_norm, cb.dim, p + "attn_norm");
    expect_same_vec(lb.ffn_norm, lg.ffn_norm, cb.dim, p + "ffn_norm");
  }
  EXPECT_NE(b->identity(), g->identity());
}

TEST(Llama2c, VocabMatchesGguf) {
  if (!shared_available()) GTEST_SKIP();
  const Vocab v = read_llama2c_vocab(shared("models/stories260K/tok512.bin"), 512);
  auto gm = Model::load(shared(kStoriesGguf));
  const Vocab& g = gm->vocab();
  EXPECT_EQ(v.tokens, g.tokens);
  EXPECT_EQ(v.scores, g.scores);
  EXPECT_EQ(v.types, g.types);
  EXPECT_EQ(v.kind, VocabKind::Spm);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_TRUE(v.add_bos);
  EXPECT_TRUE(v.add_space_prefix);
  EXPECT_TRUE(v.llama2c);
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.tokens[259], "\xE2\x96\x81t");  // " t" with U+2581
  EXPECT_EQ(v.types[3], static_cast<int32_t>(TokenAttr::Byte));
  EXPECT_EQ(v.types[0], static_cast<int32_t>(TokenAttr::Unknown));
  // The wrong vocabulary size is caught.
  EXPECT_NE(model_error([] { read_llama2c_vocab(shared("models/stories260K/tok512.bin"), 500); }).find("after token 499"),
            std::string::npos);
  EXPECT_NE(model_error([] { read_llama2c_vocab(shared("models/stories260K/tok512.bin"), 600); }).find("truncated"),
            std::string::npos);
}

namespace {

struct Ckpt {
  int dim = 8, hidden = 16, layers = 2, heads = 2, kv = 1, vocab = 260, seq = 6;
  bool tied = true;
};

// Writes a synthetic llama2.c checkpoint (values = index * 1e-3) and returns the float count.
size_t write_ckpt(const std::string& path, const Ckpt& c, int extra_bytes = 0) {
  const int hs = c.dim / c.heads, kvd = c.kv * hs;
  const size_t n = size_t(c.vocab) * c.dim + size_t(c.layers) * (2 * c.dim + 2 * c.dim * c.dim + 2 * kvd * c.dim +
                                                                   3 * c.dim * c.hidden) +
                   c.dim + size_t(c.seq) * hs + (c.tied ? 0 : size_t(c.vocab) * c.dim);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const int32_t h[7] = {c.dim, c.hidden, c.layers, c.heads, c.kv, c.tied ? c.vocab : -c.vocab, c.seq};
  f.write(reinterpret_cast<const char*>(h), sizeof h);
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(i % 1000) * 1e-3f;
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  for (int i = 0; i < extra_bytes; ++i) f.put(0);
  return n;
}

void write_tok(const std::string& path, int n, int truncate_last = 0) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const int32_t max_len = 8;
  f.write(reinterpret_cast<const char*>(&max_len), 4);
  for (int i = 0; i < n; ++i) {
    std::string s = i == 0 ? "<unk>" : i == 1 ? "\n<s>\n" : i == 2 ? "\n</s>\n" : i < 259 ? "" : " w" + std::to_string(i);
    if (i >= 3 && i < 259) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
      s = buf;
    }
    const float score = -float(i);
    const int32_t len = static_cast<int32_t>(s.size());
    f.write(reinterpret_cast<const char*>(&score), 4);
    f.write(reinterpret_cast<const char*>(&len), 4);
    f.write(s.data(), static_cast<std::streamsize>(s.size()) - (i == n - 1 ? truncate_last : 0));
  }
}

}  // namespace

TEST(Llama2c, SyntheticCheckpoints) {
  const std::string dir = tmp("l2c");
  fs::create_directories(dir);
  Ckpt c;
  write_ckpt(dir + "/m.bin", c);
  // No tokenizer beside it: the error says how to fix it.
  std::string e = model_error([&] { Model::load(dir + "/m.bin"); });
  EXPECT_NE(e.find("--tokenizer"), std::string::npos) << e;
  EXPECT_NE(e.find("tok260.bin"), std::string::npos) << e;
  write_tok(dir + "/tok260.bin", 260);
  auto m = Model::load(dir + "/m.bin");
  EXPECT_EQ(m->config().n_vocab, 260);
  EXPECT_EQ(m->config().head_dim, 4);
  EXPECT_TRUE(m->config().tied_output);
  EXPECT_EQ(m->vocab().tokens[259], "\xE2\x96\x81w259");
  EXPECT_FLOAT_EQ(rowf(m->weights().tok_embd, 1)[0], 8e-3f);
  // Layer 1's wq starts after embeddings (260*8), rms_att (2*8) and layer 0's wq (64).
  EXPECT_FLOAT_EQ(rowf(m->weights().layers[1].wq, 0)[0], float((2080 + 16 + 64) % 1000) * 1e-3f);

  // Untied: the classifier is the last vocab*dim floats.
  Ckpt u = c;
  u.tied = false;
  const size_t n = write_ckpt(dir + "/u.bin", u);
  auto mu = Model::load(dir + "/u.bin", dir + "/tok260.bin");
  EXPECT_FALSE(mu->config().tied_output);
  EXPECT_NE(mu->weights().output.data, mu->weights().tok_embd.data);
  EXPECT_FLOAT_EQ(rowf(mu->weights().output, 0)[0], float((n - 260 * 8) % 1000) * 1e-3f);

  // Size must match the header exactly.
  write_ckpt(dir + "/long.bin", c, 4);
  e = model_error([&] { Model::load(dir + "/long.bin", dir + "/tok260.bin"); });
  EXPECT_NE(e.find(dir + "/long.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("file size"), std::string::npos) << e;
  Ckpt bad = c;
  bad.heads = 3;
  write_ckpt(dir + "/heads.bin", bad);
  e = model_error([&] { Model::load(dir + "/heads.bin", dir + "/tok260.bin"); });
  EXPECT_NE(e.find("n_heads"), std::string::npos) << e;
  write_bytes(dir + "/short.bin", {1, 2, 3});
  e = model_error([&] { Model::load(dir + "/short.bin", dir + "/tok260.bin"); });
  EXPECT_NE(e.find("too short"), std::string::npos) << e;
  // Broken tokenizers.
  write_tok(dir + "/trunc.bin", 260, 2);
  e = model_error([&] { Model::load(dir + "/m.bin", dir + "/trunc.bin"); });
  EXPECT_NE(e.find("trunc.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  write_tok(dir + "/big.bin", 300);
  e = model_error([&] { Model::load(dir + "/m.bin", dir + "/big.bin"); });
  EXPECT_NE(e.find("more tokens"), std::string::npos) << e;
  EXPECT_NE(model_error([&] { Model::load(dir + "/missing.bin"); }).find("cannot open"), std::string::npos);
}

// ---- conversion ------------------------------------------------------------------

TEST(Convert, Llama2cToGgufEqualsSharedGguf) {
  if (!shared_available()) GTEST_SKIP();
  const std::string out = tmp("stories-conv.gguf");
  convert_llama2c(shared(kStoriesBin), "", out, GgmlType::F32);
  auto conv = GgufFile::open(out);
  auto ref = GgufFile::open(shared(kStoriesGguf));
  // Same tensors, byte for byte (the converted file ties output to token_embd).
  EXPECT_EQ(conv->tensors().size() + 1, ref->tensors().size());
  for (const auto& t : conv->tensors()) {
    const GgufTensorInfo* r = ref->find_tensor(t.name);
    ASSERT_NE(r, nullptr) << t.name;
    EXPECT_EQ(t.dims, r->dims) << t.name;
    EXPECT_EQ(t.type, GgmlType::F32) << t.name;
    ASSERT_EQ(t.nbytes, r->nbytes) << t.name;
    EXPECT_EQ(std::memcmp(t.data, r->data, t.nbytes), 0) << t.name;
  }
  EXPECT_EQ(conv->find_tensor("output.weight"), nullptr);
  const GgufTensorInfo* ro = ref->find_tensor("output.weight");
  EXPECT_EQ(std::memcmp(conv->find_tensor("token_embd.weight")->data, ro->data, ro->nbytes), 0);
  for (const char* k : {"llama.context_length", "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
                        "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
                        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"})
    EXPECT_EQ(conv->get_u64(k), ref->get_u64(k)) << k;
  EXPECT_EQ(conv->get_str("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(conv->find("tokenizer.ggml.tokens")->as_arr().strings, ref->find("tokenizer.ggml.tokens")->as_arr().strings);
  EXPECT_EQ(conv->find("tokenizer.ggml.scores")->as_arr().f32, ref->find("tokenizer.ggml.scores")->as_arr().f32);
  EXPECT_EQ(conv->find("tokenizer.ggml.token_type")->as_arr().ints, ref->find("tokenizer.ggml.token_type")->as_arr().ints);

  // Loaded, it is the same model as the .bin.
  auto a = Model::load(out);
  auto b = Model::load(shared(kStoriesBin));
  EXPECT_EQ(a->config().n_ctx_train, 512);
  EXPECT_TRUE(a->config().tied_output);
  expect_same_weights(a->weights().layers[3].wq, b->weights().layers[3].wq, "wq");
  EXPECT_EQ(a->vocab().tokens, b->vocab().tokens);
  EXPECT_EQ(a->vocab().bos, 1);

  // Quantized conversion: 64-wide rows become Q8_0, 172-wide rows fall back to F16.
  const std::string q = tmp("stories-q8.gguf");
  convert_llama2c(shared(kStoriesBin), shared("models/stories260K/tok512.bin"), q, GgmlType::Q8_0);
  auto mq = Model::load(q);
  EXPECT_EQ(mq->weights().layers[0].wq.type, GgmlType::Q8_0);
  EXPECT_EQ(mq->weights().layers[0].w_down.type, GgmlType::F16);
  auto r0 = rowf(mq->weights().layers[0].wq, 5), r1 = rowf(b->weights().layers[0].wq, 5);
  for (size_t i = 0; i < r0.size(); ++i) EXPECT_NEAR(r0[i], r1[i], 0.01f);
}

TEST(Convert, LogitsEqualTheBin) {
  if (!shared_available()) GTEST_SKIP();
  const std::string out = tmp("stories-conv-logits.gguf");
  convert_llama2c(shared(kStoriesBin), "", out, GgmlType::F32);
  EngineOptions eo;
  eo.n_threads = 1;
  Engine eb(Model::load(shared(kStoriesBin)), eo), eg(Model::load(out), eo);
  LocalSequence sb(eb, 64), sg(eg, 64);
  const std::vector<int32_t> toks = {1, 403, 407, 261, 378, 300, 42, 259};
  const std::vector<float> lb = sb.eval(toks, true);
  const std::vector<float>& lg = sg.eval(toks, true);
  ASSERT_EQ(lb.size(), toks.size() * 512);
  EXPECT_EQ(lb, lg);  // same weights, same arithmetic: bit-identical
}

// ---- random models ---------------------------------------------------------------------

TEST(MakeModel, TinyLlamaEveryType) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                     GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::MXFP4}) {
    MakeModelOptions o;
    o.out = tmp("rand-" + type_name(t) + ".gguf");
    o.type = t;
    o.progress = false;
    make_random_model(o);
    auto m = Model::load(o.out);
    const ModelConfig& c = m->config();
    EXPECT_EQ(c.dim, 64);
    EXPECT_EQ(c.n_layers, 2);
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.ffn_dim, 192);
    EXPECT_EQ(c.n_vocab, 512);
    EXPECT_FALSE(c.tied_output);
    EXPECT_EQ(m->weights().layers[1].w_down.type, t) << type_name(t);
    EXPECT_EQ(m->weights().layers[1].attn_norm[5], 1.f);
    // Embedding entries are ~N(0, 1/sqrt(dim)).
    double s2 = 0;
    for (int r = 0; r < 512; ++r)
      for (float x : rowf(m->weights().tok_embd, r)) s2 += double(x) * x;
    EXPECT_NEAR(std::sqrt(s2 / (512 * 64)), 0.125, 0.02) << type_name(t);
    EXPECT_EQ(m->vocab().tokens[1], "<s>");
    EXPECT_EQ(m->vocab().types[100], static_cast<int32_t>(TokenAttr::Byte));
  }
}

TEST(MakeModel, DeterministicQwenWithCopiedVocab) {
  MakeModelOptions o;
  o.arch = "qwen2";
  o.dim = 256;
  o.n_heads = 8;
  o.n_kv_heads = 1;
  o.ffn_dim = 256;
  o.type = GgmlType::Q4_K;
  o.tied = true;
  o.progress = false;
  o.seed = 7;
  if (shared_available()) o.vocab_from = shared("models/tiny-random/tiny-qwen2-q8_0.gguf");
  o.out = tmp("q1.gguf");
  make_random_model(o);
  o.out = tmp("q2.gguf");
  make_random_model(o);
  EXPECT_EQ(read_bytes(tmp("q1.gguf")), read_bytes(tmp("q2.gguf")));
  o.seed = 8;
  o.out = tmp("q3.gguf");
  make_random_model(o);
  EXPECT_NE(read_bytes(tmp("q1.gguf")), read_bytes(tmp("q3.gguf")));
  auto m = Model::load(tmp("q1.gguf"));
  EXPECT_EQ(m->config().arch, "qwen2");
  EXPECT_EQ(m->config().rope, RopeStyle::Neox);
  EXPECT_TRUE(m->config().has_qkv_bias);
  EXPECT_TRUE(m->config().tied_output);
  EXPECT_EQ(m->weights().layers[0].wq.type, GgmlType::Q4_K);
  if (shared_available()) {
    auto src = Model::load(shared("models/tiny-random/tiny-qwen2-q8_0.gguf"));
    EXPECT_EQ(m->vocab().tokens, src->vocab().tokens);
    EXPECT_EQ(m->vocab().merges, src->vocab().merges);
    EXPECT_EQ(m->config().n_vocab, 50257);
  }
}

TEST(MakeModel, OptionsAndPresets) {
  MakeModelOptions o;
  apply_model_preset("1.1b", o);
  EXPECT_EQ(o.dim, 2048);
  EXPECT_EQ(o.n_layers, 16);
  EXPECT_EQ(o.n_heads, 32);
  EXPECT_EQ(o.n_kv_heads, 8);
  EXPECT_EQ(o.ffn_dim, 8192);
  EXPECT_EQ(o.n_vocab, 32000);
  EXPECT_THROW(apply_model_preset("7b", o), std::invalid_argument);
  EXPECT_EQ(parse_tensor_type("Q4_0"), GgmlType::Q4_0);
  EXPECT_EQ(parse_tensor_type("mxfp4"), GgmlType::MXFP4);
  EXPECT_EQ(parse_tensor_type("bf16"), GgmlType::BF16);
  EXPECT_THROW(parse_tensor_type("q3_k"), std::invalid_argument);
  MakeModelOptions b;
  b.out = tmp("bad.gguf");
  b.progress = false;
  b.n_heads = 3;
  EXPECT_THROW(make_random_model(b), std::invalid_argument);
  b.n_heads = 4;
  b.n_kv_heads = 3;
  EXPECT_THROW(make_random_model(b), std::invalid_argument);
  b.n_kv_heads = 2;
  b.arch = "gpt2";
  EXPECT_THROW(make_random_model(b), std::invalid_argument);
  b.arch = "llama";
  b.n_vocab = 100;
  EXPECT_THROW(make_random_model(b), std::invalid_argument);
  b.n_vocab = 32000;  // the built-in vocabulary fills any size
  b.n_layers = 1;
  b.type = GgmlType::Q4_0;
  make_random_model(b);
  auto m = Model::load(b.out);
  std::set<std::string> uniq(m->vocab().tokens.begin(), m->vocab().tokens.end());
  EXPECT_EQ(uniq.size(), 32000u);
}

TEST(MakeModel, CommandLine) {
  std::string out, err;
  const std::string p = tmp("cli-tiny.gguf");
  ASSERT_EQ(run_kvserve({"make-model", "-o", p, "--preset", "tiny", "--type", "q4_0", "--layers", "3", "--seed", "9"},
                        &out, &err), 0) << err;
  EXPECT_NE(err.find("[21/30] blk.1.ffn_down.weight"), std::string::npos) << err;  // progress lines
  auto m = Model::load(p);
  EXPECT_EQ(m->config().n_layers, 3);  // explicit option wins over the preset
  EXPECT_EQ(m->config().dim, 64);
  EXPECT_EQ(m->weights().layers[2].wq.type, GgmlType::Q4_0);
  EXPECT_NE(run_kvserve({"make-model", "-o", tmp("x.gguf"), "--type", "q3_k"}, &out, &err), 0);
  EXPECT_NE(err.find("unknown tensor type 'q3_k'"), std::string::npos) << err;
  EXPECT_NE(run_kvserve({"make-model", "-o", tmp("x.gguf"), "--heads", "5", "-q"}, &out, &err), 0);
  EXPECT_NE(err.find("not a multiple of heads 5"), std::string::npos) << err;
  if (!shared_available()) return;
  const std::string c = tmp("cli-conv.gguf");
  ASSERT_EQ(run_kvserve({"convert", "--bin", shared(kStoriesBin), "-o", c}, &out, &err), 0) << err;
  EXPECT_EQ(Model::load(c)->config().n_layers, 5);
  EXPECT_NE(run_kvserve({"convert", "--bin", tmp("nope.bin"), "-o", c}, &out, &err), 0);
  EXPECT_NE(err.find("nope.bin"), std::string::npos) << err;
}

// ---- model-level errors ----------------------------------------------------------------

namespace {

void expect_load_error(const std::string& name, const std::function<void(GgufWriter&)>& kv,
                       const std::function<bool(TensorCopy&)>& tensor, std::initializer_list<const char*> parts,
                       const std::function<bool(const std::string&)>& keep = nullptr) {
  const std::string p = tmp(name);
  rewrite_gguf(tiny_model(), p, kv, tensor, keep);
  const std::string e = model_error([&] { Model::load(p); });
  ASSERT_FALSE(e.empty()) << name << " loaded without error";
  EXPECT_NE(e.find(p), std::string::npos) << "no file name in: " << e;
  for (const char* s : parts) EXPECT_NE(e.find(s), std::string::npos) << "missing '" << s << "' in: " << e;
}

}  // namespace

TEST(ModelBad, ErrorsNameFileAndTensor) {
  EXPECT_NO_THROW(Model::load(tiny_model()));
  expect_load_error("arch.gguf", [](GgufWriter& w) { w.set_str("general.architecture", "falcon"); }, nullptr,
                    {"'general.architecture'", "'falcon'", "llama, mistral, qwen2"});
  expect_load_error("missing.gguf", nullptr, [](TensorCopy& t) { return t.name != "blk.1.ffn_up.weight"; },
                    {"tensor 'blk.1.ffn_up.weight' is missing"});
  expect_load_error("shape.gguf", nullptr,
                    [](TensorCopy& t) {
                      if (t.name == "blk.0.attn_k.weight") t.dims = {32, 64};  // was {64, 32}
                      return true;
                    },
                    {"'blk.0.attn_k.weight' has shape [32, 64], expected [64, 32]"});
  expect_load_error("nokey.gguf", nullptr, nullptr, {"'llama.embedding_length'", "missing"},
                    [](const std::string& k) { return k != "llama.embedding_length"; });
  expect_load_error("kvheads.gguf", [](GgufWriter& w) { w.set_u32("llama.attention.head_count_kv", 3); }, nullptr,
                    {"'llama.attention.head_count_kv'"});
  expect_load_error("layers.gguf", [](GgufWriter& w) { w.set_u32("llama.block_count", 1); }, nullptr,
                    {"'blk.1.attn_norm.weight' exists", "block_count"});
  expect_load_error("layers3.gguf", [](GgufWriter& w) { w.set_u32("llama.block_count", 3); }, nullptr,
                    {"'blk.2.attn_norm.weight' is missing"});
  expect_load_error("vocab.gguf", nullptr,
                    [](TensorCopy& t) {
                      if (t.name == "token_embd.weight") {
                        t.dims = {64, 500};
                        t.data.resize(64 * 500 * 4);
                      }
                      return true;
                    },
                    {"'token_embd.weight' has shape [64, 500], expected [64, 512]"});
  expect_load_error("qnorm.gguf", nullptr,
                    [](TensorCopy& t) {
                      if (t.name == "output_norm.weight") {
                        std::vector<float> ones(64, 1.f);
                        t.type = GgmlType::Q8_0;
                        t.data.assign(row_bytes(GgmlType::Q8_0, 64), 0);
                        quantize_row(GgmlType::Q8_0, ones.data(), t.data.data(), 64);
                      }
                      return true;
                    },
                    {"'output_norm.weight' has type Q8_0, expected F32"});
  expect_load_error("eps.gguf", [](GgufWriter& w) { w.set_f32("llama.attention.layer_norm_rms_epsilon", -1.f); },
                    nullptr, {"layer_norm_rms_epsilon"});
}

TEST(ModelBad, F16NormsAreConverted) {
  const std::string p = tmp("f16norm.gguf");
  rewrite_gguf(tiny_model(), p, nullptr, [](TensorCopy& t) {
    if (t.name == "blk.0.ffn_norm.weight") {
      std::vector<float> v(64, 0.5f);
      t.type = GgmlType::F16;
      t.data.assign(128, 0);
      quantize_row(GgmlType::F16, v.data(), t.data.data(), 64);
    }
    return true;
  });
  auto m = Model::load(p);
  EXPECT_EQ(m->weights().layers[0].ffn_norm[63], 0.5f);
  EXPECT_EQ(m->weights().layers[1].ffn_norm[0], 1.f);
}
