// The architectures beyond llama / qwen2: what config_from_gguf and the
// loader make of files that `make-model --arch` writes (per-layer windows,
// RoPE kinds, query scales, soft-caps, fused tensors as views, optional
// tensors), make-model's flags and refusals, and the loader's refusals, each
// naming its key or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "gguf_test_util.h"
#include "model/model.h"
#include "test_util.h"
#include "tools/make_model.h"

using namespace kvs;
using namespace kvs::test;

namespace {

std::string tmp(const std::string& name) { return temp_dir() + "/" + name; }

// A small random model of `arch`; `edit` adjusts the options first.
std::string make(const std::string& file, const std::string& arch, const std::function<void(MakeModelOptions&)>& edit = nullptr) {
  MakeModelOptions o;
  o.out = tmp(file);
  o.arch = arch;
  o.dim = 64;
  o.n_layers = 4;
  o.type = GgmlType::F32;
  o.progress = false;
  if (edit) edit(o);
  make_random_model(o);
  return o.out;
}

std::string make_error(const std::function<void(MakeModelOptions&)>& edit) {
  MakeModelOptions o;
  o.out = tmp("bad.gguf");
  o.progress = false;
  edit(o);
  try {
    make_random_model(o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// The loader's message for `src` rewritten by `kv` / `tensor`, which must name the file.
std::string load_error(const std::string& src, const std::string& name, const std::function<void(GgufWriter&)>& kv,
                       const std::function<bool(TensorCopy&)>& tensor = nullptr) {
  const std::string p = tmp(name);
  rewrite_gguf(src, p, kv, tensor);
  const std::string e = model_error([&] { Model::load(p); });
  EXPECT_NE(e.find(p), std::string::npos) << "no file name in: " << e;
  return e;
}

}  // namespace

TEST(ModelArch, LlamaExtras) {
  // Head size from key_length (Mistral Nemo's shape), Llama 3.1 factors, YaRN, tied output.
  auto m = Model::load(make("llama.gguf", "llama", [](MakeModelOptions& o) {
    o.n_heads = 8, o.n_kv_heads = 2, o.head_dim = 32, o.tied = true, o.rope_factors = true;
    o.rope_scaling = "yarn", o.rope_scale = 4, o.n_ctx = 256;
  }));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.n_rot, 32);
  EXPECT_TRUE(c.tied_output);
  EXPECT_EQ(c.rope_factors, RopeFactors::Freqs);
  ASSERT_NE(m->weights().rope_freqs, nullptr);
  EXPECT_EQ(m->weights().rope_factors_for(c, 0), m->weights().rope_freqs);
  EXPECT_FLOAT_EQ(c.ropes[0].freq_scale, 0.25f);
  EXPECT_EQ(c.ropes[0].ext_factor, 1.f);
  EXPECT_EQ(c.ropes[0].n_ctx_orig, 64);
  EXPECT_EQ(m->weights().layers[0].wq.rows, 8 * 32);
  EXPECT_EQ(m->weights().layers[0].wo.cols, 8 * 32);
  auto lin = Model::load(make("linear.gguf", "llama", [](MakeModelOptions& o) { o.rope_scaling = "linear", o.rope_scale = 2; }));
  EXPECT_FLOAT_EQ(lin->config().ropes[0].freq_scale, 0.5f);
  EXPECT_EQ(lin->config().ropes[0].ext_factor, 0.f);
}

TEST(ModelArch, Qwen3) {
  auto m = Model::load(make("qwen3.gguf", "qwen3", [](MakeModelOptions& o) { o.n_heads = 8, o.n_kv_heads = 4, o.head_dim = 16; }));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.rope, RopeStyle::Neox);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.has_qkv_bias);
  EXPECT_EQ(c.head_dim, 16);
  ASSERT_NE(m->weights().layers[3].q_norm, nullptr);
  ASSERT_NE(m->weights().layers[3].k_norm, nullptr);
  EXPECT_NE(m->weights().layers[3].q_norm[0], 1.f);  // random around 1, so a misapplied norm shows
}

TEST(ModelArch, Gemma2) {
  auto m = Model::load(make("gemma2.gguf", "gemma2", [](MakeModelOptions& o) {
    o.n_layers = 5, o.head_dim = 32, o.window = 48, o.attn_softcap = 20, o.final_softcap = 15;
  }));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.layer_window, (std::vector<int>{48, 0, 48, 0, 48}));
  EXPECT_EQ(c.sliding_window, 0);  // not every layer: the sequence keeps its whole context
  EXPECT_FLOAT_EQ(c.attn_scale, 1.f / std::sqrt(32.f));
  EXPECT_EQ(c.attn_softcap, 20.f);
  EXPECT_EQ(c.final_softcap, 15.f);
  EXPECT_FLOAT_EQ(c.embd_scale, 8.f);
  EXPECT_EQ(c.ffn_act, FfnAct::GeluTanh);
  EXPECT_TRUE(c.tied_output);
  ASSERT_NE(m->weights().layers[4].attn_post_norm, nullptr);
  ASSERT_NE(m->weights().layers[4].ffn_post_norm, nullptr);
  // The 27B shape (46 layers) scales queries by 1 / sqrt(dim / heads), as the peers do.
  auto big = GgufFile::open(make("gemma2-46.gguf", "gemma2", [](MakeModelOptions& o) { o.n_layers = 46, o.head_dim = 32; }));
  EXPECT_FLOAT_EQ(config_from_gguf(*big).attn_scale, 1.f / std::sqrt(16.f));
  EXPECT_EQ(config_from_gguf(*big).attn_softcap, 50.f);  // Gemma 2's defaults
  EXPECT_EQ(config_from_gguf(*big).layer_window[44], 4096);
}

TEST(ModelArch, Gemma3) {
  auto m = Model::load(make("gemma3.gguf", "gemma3", [](MakeModelOptions& o) {
    o.n_layers = 12, o.window = 32, o.rope_scaling = "linear", o.rope_scale = 8;
  }));
  const ModelConfig& c = m->config();
  for (int l = 0; l < 12; ++l) {
    const bool global = l == 5 || l == 11;
    EXPECT_EQ(c.layer_window[size_t(l)], global ? 0 : 32) << l;
    EXPECT_EQ(c.layer_rope[size_t(l)], global ? 0 : 1) << l;
  }
  ASSERT_EQ(c.ropes.size(), 2u);
  EXPECT_EQ(c.ropes[0].theta, 1e6f);  // global: the file's base and scaling
  EXPECT_FLOAT_EQ(c.ropes[0].freq_scale, 0.125f);
  EXPECT_EQ(c.ropes[1].theta, 10000.f);  // local: Gemma 3's fixed base, unscaled
  EXPECT_EQ(c.ropes[1].freq_scale, 1.f);
  EXPECT_TRUE(c.qk_norm && c.post_norms);
  EXPECT_EQ(c.attn_softcap, 0.f);
  EXPECT_EQ(c.final_softcap, 0.f);
  auto big = GgufFile::open(make("gemma3-62.gguf", "gemma3", [](MakeModelOptions& o) { o.n_layers = 62, o.head_dim = 32; }));
  EXPECT_FLOAT_EQ(config_from_gguf(*big).attn_scale, 1.f / std::sqrt(16.f));
}

TEST(ModelArch, Phi3FusedTensorsAreViews) {
  auto m = Model::load(make("phi3.gguf", "phi3", [](MakeModelOptions& o) {
    o.n_heads = 4, o.n_kv_heads = 4, o.window = 40, o.rope_factors = true, o.n_ctx = 256, o.rope_orig_ctx = 64;
  }));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.layer_window, std::vector<int>(4, 40));
  EXPECT_EQ(c.sliding_window, 40);  // every layer: the sequence's native window policy
  EXPECT_EQ(c.rope_factors, RopeFactors::LongShort);
  EXPECT_FLOAT_EQ(c.ropes[0].attn_factor, float(std::sqrt(1 + std::log(4.0) / std::log(64.0))));
  const ModelWeights& w = m->weights();
  EXPECT_EQ(w.rope_factors_for(c, 256), w.rope_long);   // longer than the original context
  EXPECT_EQ(w.rope_factors_for(c, 64), w.rope_short);
  EXPECT_EQ(w.rope_factors_for(c, 0), w.rope_long);     // the training context, 256
  const LayerWeights& L = w.layers[1];
  const size_t row = L.wq.row_stride;
  EXPECT_EQ(L.wk.data, static_cast<const uint8_t*>(L.wq.data) + 64 * row);
  EXPECT_EQ(L.wv.data, static_cast<const uint8_t*>(L.wq.data) + 128 * row);
  EXPECT_EQ(L.w_up.data, static_cast<const uint8_t*>(L.w_gate.data) + 192 * L.w_gate.row_stride);
  EXPECT_EQ(L.wk.rows, 64);
  EXPECT_EQ(L.w_up.rows, 192);
}

TEST(MakeModelArch, FlagsTheArchitectureCannotHonourAreErrors) {
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.arch = "falcon"; }).find("unsupported arch 'falcon'"), std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.window = 8; }).find("--window: llama has no sliding window"),
            std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.arch = "phi3", o.tied = true; }).find("--tied"), std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.arch = "phi3", o.head_dim = 32; }).find("--head-dim"), std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.attn_softcap = 5; }).find("--attn-softcap"), std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.arch = "qwen3", o.rope_factors = true; }).find("--rope-factors"),
            std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.rope_scaling = "ntk", o.rope_scale = 2; }).find("--rope-scaling 'ntk'"),
            std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.rope_scale = 2; }).find("--rope-scale and --rope-scaling"),
            std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.rope_orig_ctx = 64; }).find("--rope-orig-ctx"), std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.arch = "gemma2", o.window = 0; }).find("--window must be > 0"),
            std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& o) { o.head_dim = 7; }).find("must be even"), std::string::npos);
}

TEST(MakeModelArch, DefaultsGiveValidFilesAndTheSameBytesEachRun) {
  for (const char* arch : {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"}) {
    SCOPED_TRACE(arch);
    MakeModelOptions o;
    o.arch = arch;
    o.dim = 128;
    o.n_layers = 6;
    o.progress = false;
    o.out = tmp(std::string("d1-") + arch + ".gguf");
    make_random_model(o);
    o.out = tmp(std::string("d2-") + arch + ".gguf");
    make_random_model(o);
    EXPECT_EQ(read_bytes(tmp(std::string("d1-") + arch + ".gguf")), read_bytes(o.out));
    EXPECT_EQ(Model::load(o.out)->config().arch, arch);
  }
}

TEST(ModelArchBad, RefusalsNameTheKeyOrTensor) {
  const std::string llama = make("base-llama.gguf", "llama", [](MakeModelOptions& o) { o.rope_factors = true; });
  std::string e = load_error(llama, "freqs.gguf", nullptr, [](TensorCopy& t) {
    if (t.name == "rope_freqs.weight") t.dims = {4}, t.data.resize(4 * 4);  // n_rot / 2 = 8
    return true;
  });
  EXPECT_NE(e.find("'rope_freqs.weight' has shape [4], expected [8]"), std::string::npos) << e;
  e = load_error(llama, "unused.gguf", [](GgufWriter& w) {
    std::vector<float> b(64, 0.f);
    w.add_tensor_f32("blk.0.attn_output.bias", GgmlType::F32, {64}, b.data());
  });
  EXPECT_NE(e.find("tensor 'blk.0.attn_output.bias' is in the file, but kvserve's llama does not use it"), std::string::npos) << e;
  e = load_error(llama, "longfactors.gguf", [](GgufWriter& w) {  // LongRoPE factors, but not scaling type longrope
    std::vector<float> f(8, 1.f);
    w.add_tensor_f32("rope_factors_long.weight", GgmlType::F32, {8}, f.data());
  });
  EXPECT_NE(e.find("tensor 'rope_factors_long.weight' is in the file, but kvserve's llama does not use it"),
            std::string::npos) << e;
  e = load_error(llama, "scaling.gguf", [](GgufWriter& w) { w.set_str("llama.rope.scaling.type", "su"); });
  EXPECT_NE(e.find("key 'llama.rope.scaling.type' = 'su' is not supported"), std::string::npos) << e;
  e = load_error(llama, "unknown.gguf", [](GgufWriter& w) { w.set_str("general.architecture", "gpt-neox"); });
  EXPECT_NE(e.find("unsupported architecture 'gpt-neox'"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3, gemma2, gemma3, phi3"), std::string::npos) << e;

  const std::string gemma = make("base-gemma2.gguf", "gemma2");
  e = load_error(gemma, "nopost.gguf", nullptr, [](TensorCopy& t) { return t.name != "blk.1.post_ffw_norm.weight"; });
  EXPECT_NE(e.find("'blk.1.post_ffw_norm.weight' is missing"), std::string::npos) << e;
  const std::string qwen3 = make("base-qwen3.gguf", "qwen3");
  e = load_error(qwen3, "bias.gguf", [](GgufWriter& w) {
    std::vector<float> b(64, 0.f);
    w.add_tensor_f32("blk.0.attn_q.bias", GgmlType::F32, {64}, b.data());
  });
  EXPECT_NE(e.find("'blk.0.attn_q.bias' is in the file, but kvserve's qwen3 does not use it"), std::string::npos) << e;
  const std::string g3 = make("base-gemma3.gguf", "gemma3", [](MakeModelOptions& o) { o.n_layers = 6; });
  const std::string p = tmp("nowindow.gguf");
  rewrite_gguf(g3, p, nullptr, nullptr, [](const std::string& k) { return k != "gemma3.attention.sliding_window"; });
  e = model_error([&] { Model::load(p); });
  EXPECT_NE(e.find("required key 'gemma3.attention.sliding_window' is missing"), std::string::npos) << e;
  const std::string phi3 = make("base-phi3.gguf", "phi3");
  e = load_error(phi3, "phi3hd.gguf", [](GgufWriter& w) { w.set_u32("phi3.attention.key_length", 32); });
  EXPECT_NE(e.find("'phi3.attention.key_length' = 32 differs from embedding_length / head_count"), std::string::npos) << e;
}
