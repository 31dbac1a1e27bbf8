// gpt-oss (ik_llama.cpp's LLM_ARCH_OPENAI_MOE): what config_from_gguf and
// the loader make of a file `make-model --arch gpt-oss` writes (windows on
// even layers, query scale, learned sinks, output bias, the FFN norm under
// its post_attention_norm name, top-k-then-softmax routing with biases, the
// clamped SwiGLU, MXFP4 experts as slices), make-model's defaults and
// flags, that the learned sinks change the output and take part in every
// path bit for bit, and the loader's refusals, each naming its key or tensor.
// (Peer golden: test_golden_arch; batching / chunking / prefix hits:
// test_arch_equivalence.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/local_sequence.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "test_util.h"
#include "tools/make_model.h"

using namespace kvs;
using namespace kvs::test;

namespace {

std::string tmp(const std::string& name) { return temp_dir() + "/" + name; }

// A small gpt-oss: 4 layers, 8 heads of 64 over 2 KV heads, window 8.
MakeModelOptions small(const std::string& file) {
  MakeModelOptions o;
  o.out = tmp(file);
  o.arch = "gpt-oss";
  o.dim = 64;
  o.n_layers = 4;
  o.n_heads = 8;
  o.n_kv_heads = 2;
  o.ffn_dim = 96;
  o.n_ctx = 128;
  o.window = 8;
  o.type = GgmlType::F16;
  o.progress = false;
  return o;
}

std::string make_small(const std::string& file) {
  const MakeModelOptions o = small(file);
  make_random_model(o);
  return o.out;
}

// The loader's message for `src` rewritten by `kv` / `tensor` / `keep_key`.
std::string load_error(const std::string& src, const std::string& name, const std::function<void(GgufWriter&)>& kv,
                       const std::function<bool(TensorCopy&)>& tensor = nullptr,
                       const std::function<bool(const std::string&)>& keep_key = nullptr) {
  const std::string p = tmp(name);
  rewrite_gguf(src, p, kv, tensor, keep_key);
  const std::string e = model_error([&] { Model::load(p); });
  EXPECT_NE(e.find(p), std::string::npos) << "no file name in: " << e;
  return e;
}

std::string make_error(const std::function<void(MakeModelOptions&)>& edit) {
  MakeModelOptions o = small("bad.gguf");
  edit(o);
  try {
    make_random_model(o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(GptOss, LoadsAsThePeerReadsIt) {
  auto m = Model::load(make_small("gptoss.gguf"));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "gpt-oss");
  EXPECT_EQ(c.head_dim, 64);  // the default, whatever the width
  EXPECT_EQ(c.n_rot, 64);
  EXPECT_EQ(c.rope, RopeStyle::Neox);
  EXPECT_EQ(c.layer_window, (std::vector<int>{8, 0, 8, 0}));  // even layers windowed
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / 8.0f);  // 1 / sqrt(n_rot)
  EXPECT_TRUE(c.attn_sinks);
  EXPECT_TRUE(c.has_qkv_bias);
  EXPECT_FALSE(c.tied_output);
  // YaRN x32 over ctx / 32, the default.
  ASSERT_EQ(c.ropes.size(), 1u);
  EXPECT_FLOAT_EQ(c.ropes[0].theta, 150000.f);
  EXPECT_FLOAT_EQ(c.ropes[0].freq_scale, 1.f / 32.f);
  EXPECT_EQ(c.ropes[0].ext_factor, 1.f);
  EXPECT_EQ(c.ropes[0].n_ctx_orig, 4);
  EXPECT_EQ(c.moe.n_expert, 8);
  EXPECT_EQ(c.moe.n_used, 4);
  EXPECT_EQ(c.moe.ffn_dim, 96);
  EXPECT_EQ(c.moe.gating, MoeGating::TopKSoftmax);
  EXPECT_EQ(c.moe.act, MoeActivation::SwiGLUClamped);
  EXPECT_FALSE(c.moe.norm_weights);
  EXPECT_EQ(c.moe.shared_ffn_dim, 0);
  for (const LayerWeights& L : m->weights().layers) {
    EXPECT_NE(L.attn_sinks, nullptr);
    EXPECT_NE(L.bo, nullptr);
    EXPECT_NE(L.bq, nullptr);
    EXPECT_NE(L.ffn_norm, nullptr);
    EXPECT_EQ(L.wq.type, GgmlType::F16);
    EXPECT_NE(L.moe.router_bias, nullptr);
    EXPECT_NE(L.moe.gate_bias, nullptr);
    EXPECT_NE(L.moe.up_bias, nullptr);
    EXPECT_NE(L.moe.down_bias, nullptr);
    ASSERT_EQ(L.moe.gate.size(), 8u);
    EXPECT_EQ(L.moe.gate[3].type, GgmlType::MXFP4);  // experts MXFP4 by default, as the real files
    EXPECT_EQ(L.moe.down[7].type, GgmlType::MXFP4);
    EXPECT_EQ(L.moe.down[7].rows, 64);
    EXPECT_EQ(L.moe.down[7].cols, 96);
  }
  // Sink logits spread over both signs (so they matter in the tests).
  float lo = 1e9f, hi = -1e9f;
  for (int h = 0; h < c.n_heads; ++h)
    lo = std::min(lo, m->weights().layers[0].attn_sinks[h]), hi = std::max(hi, m->weights().layers[0].attn_sinks[h]);
  EXPECT_LT(lo, -0.5f);
  EXPECT_GT(hi, 0.5f);
}

// The learned sinks take a share of each head's softmax: the same file with
// every sink at -1000 (exp = 0 in float) gives other logits, and a decode
// after a prefill gives the full pass's bits either way.
TEST(GptOss, SinksChangeTheOutputAndDecodeMatchesPrefill) {
  const std::string path = make_small("sinks.gguf");
  const std::string off = tmp("nosinks.gguf");
  rewrite_gguf(path, off, nullptr, [](TensorCopy& t) {
    if (t.name.find("attn_sinks") != std::string::npos) {
      const float v = -1000.f;
      for (size_t i = 0; i + 4 <= t.data.size(); i += 4) std::memcpy(&t.data[i], &v, 4);
    }
    return true;
  });
  std::vector<int32_t> toks;
  for (int i = 0; i < 30; ++i) toks.push_back(3 + (i * 37) % 500);
  std::vector<std::vector<float>> outs;
  for (const std::string& p : {path, off}) {
    auto m = Model::load(p);
    Engine engine(m, EngineOptions{2});
    LocalSequence full(engine, 64, 16);
    const std::vector<float> ref = full.eval(toks, true);  // [n, n_vocab]
    LocalSequence inc(engine, 64, 16);
    inc.eval(toks.data(), 5, false);
    const int nv = m->config().n_vocab;
    for (int i = 5; i < int(toks.size()); ++i) {
      const std::vector<float>& lg = inc.eval(&toks[size_t(i)], 1);
      ASSERT_EQ(0, std::memcmp(lg.data(), &ref[size_t(i) * nv], size_t(nv) * 4)) << p << " position " << i;
    }
    outs.push_back(ref);
  }
  double diff = 0;
  for (size_t i = 0; i < outs[0].size(); ++i) diff = std::max(diff, double(std::fabs(outs[0][i] - outs[1][i])));
  EXPECT_GT(diff, 1e-2) << "the sinks made no difference";
}

TEST(GptOss, MakeModelDefaultsAndFlags) {
  // `make-model --arch gpt-oss --dim 128 --layers 4` alone gives a valid file, the same bytes each run.
  MakeModelOptions o;
  o.arch = "gpt-oss";
  o.dim = 128;
  o.n_layers = 4;
  o.progress = false;
  o.out = tmp("d1-gptoss.gguf");
  make_random_model(o);
  o.out = tmp("d2-gptoss.gguf");
  make_random_model(o);
  EXPECT_EQ(read_bytes(tmp("d1-gptoss.gguf")), read_bytes(o.out));
  auto m = Model::load(o.out);
  EXPECT_EQ(m->config().layer_window[0], 128);
  EXPECT_EQ(m->config().layer_window[1], 0);
  EXPECT_EQ(m->weights().layers[0].wq.type, GgmlType::Q8_0);  // --type's default
  EXPECT_EQ(m->weights().layers[0].moe.up[0].type, GgmlType::MXFP4);
  auto f = GgufFile::open(o.out);
  EXPECT_NE(f->find_tensor("blk.3.post_attention_norm.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.3.ffn_norm.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.0.attn_sinks.weight")->dims, (std::vector<int64_t>{4}));
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate_exps.bias")->dims, (std::vector<int64_t>{192, 8}));  // [n_expert, ffn_exp]
  // --expert-type overrides MXFP4.
  o.expert_type = GgmlType::Q8_0;
  o.out = tmp("q8exp-gptoss.gguf");
  make_random_model(o);
  EXPECT_EQ(Model::load(o.out)->weights().layers[1].moe.gate[2].type, GgmlType::Q8_0);

  EXPECT_NE(make_error([](MakeModelOptions& x) { x.window = 0; }).find("--window must be > 0 for gpt-oss"),
            std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& x) { x.tied = true; }).find("--tied: gpt-oss files always have output.weight"),
            std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& x) { x.n_expert = 4, x.n_expert_used = 5; }).find("--experts-used 5 exceeds"),
            std::string::npos);
  EXPECT_NE(make_error([](MakeModelOptions& x) { x.arch = "qwen3", x.window = -1, x.expert_type = GgmlType::F16; })
                .find("--expert-type needs a MoE model"),
            std::string::npos);
}

TEST(GptOss, RefusalsNameTheKeyOrTensor) {
  const std::string g = make_small("base-gptoss.gguf");
  auto drop = [](const std::string& name) { return [name](TensorCopy& t) { return t.name != name; }; };
  std::string e = load_error(g, "nosink.gguf", nullptr, drop("blk.2.attn_sinks.weight"));
  EXPECT_NE(e.find("tensor 'blk.2.attn_sinks.weight' is missing"), std::string::npos) << e;
  e = load_error(g, "sinkshape.gguf", nullptr, [](TensorCopy& t) {
    if (t.name == "blk.1.attn_sinks.weight") t.dims = {2}, t.data.resize(2 * 4);  // one per KV head: wrong
    return true;
  });
  EXPECT_NE(e.find("tensor 'blk.1.attn_sinks.weight' has shape [2], expected [8]"), std::string::npos) << e;
  e = load_error(g, "nobo.gguf", nullptr, drop("blk.0.attn_output.bias"));
  EXPECT_NE(e.find("tensor 'blk.0.attn_output.bias' is missing"), std::string::npos) << e;
  e = load_error(g, "nobq.gguf", nullptr, drop("blk.0.attn_q.bias"));
  EXPECT_NE(e.find("tensor 'blk.0.attn_q.bias' is missing (gpt-oss has q/k/v biases)"), std::string::npos) << e;
  e = load_error(g, "norouterbias.gguf", nullptr, drop("blk.3.ffn_gate_inp.bias"));
  EXPECT_NE(e.find("tensor 'blk.3.ffn_gate_inp.bias' is missing"), std::string::npos) << e;
  e = load_error(g, "downbias.gguf", nullptr, [](TensorCopy& t) {
    if (t.name == "blk.0.ffn_down_exps.bias") t.dims = {64, 4}, t.data.resize(64 * 4 * 4);
    return true;
  });
  EXPECT_NE(e.find("tensor 'blk.0.ffn_down_exps.bias' has shape [64, 4], expected [64, 8]"), std::string::npos) << e;
  e = load_error(g, "ffnnorm.gguf", nullptr, [](TensorCopy& t) {  // the dense archs' name for it: unused here
    if (t.name == "blk.0.post_attention_norm.weight") t.name = "blk.0.ffn_norm.weight";
    return true;
  });
  EXPECT_NE(e.find("tensor 'blk.0.post_attention_norm.weight' is missing"), std::string::npos) << e;
  e = load_error(g, "fusedexps.gguf", [](GgufWriter& w) {  // ik_llama.cpp's merged gate+up: not what kvserve reads
    std::vector<float> b(4, 0.f);
    w.add_tensor_f32("blk.0.ffn_gate_up_exps.bias", GgmlType::F32, {4}, b.data());
  });
  EXPECT_NE(e.find("tensor 'blk.0.ffn_gate_up_exps.bias' is in the file, but kvserve's gpt-oss does not use it"),
            std::string::npos) << e;
  e = load_error(g, "used.gguf", [](GgufWriter& w) { w.set_u32("gpt-oss.expert_used_count", 9); });
  EXPECT_NE(e.find("key 'gpt-oss.expert_used_count' = 9 exceeds expert_count 8"), std::string::npos) << e;
  e = load_error(g, "gating.gguf", [](GgufWriter& w) { w.set_u32("gpt-oss.expert_gating_func", 1); });
  EXPECT_NE(e.find("key 'gpt-oss.expert_gating_func' = 1 is not supported for gpt-oss (3 = softmax over the top k"),
            std::string::npos) << e;
  e = load_error(g, "norm.gguf", [](GgufWriter& w) { w.set_bool("gpt-oss.expert_weights_norm", true); });
  EXPECT_NE(e.find("key 'gpt-oss.expert_weights_norm' = true is not supported"), std::string::npos) << e;
  for (const char* key : {"gpt-oss.attention.sliding_window", "gpt-oss.expert_feed_forward_length",
                          "gpt-oss.expert_count", "gpt-oss.expert_used_count"}) {
    e = load_error(g, "nokey.gguf", nullptr, nullptr, [key](const std::string& k) { return k != key; });
    EXPECT_NE(e.find(std::string("'") + key + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("missing"), std::string::npos) << e;
  }
}

}  // namespace
