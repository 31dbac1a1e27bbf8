// Mixture-of-experts models end to end inside kvserve: make-model writes
// Mixtral-style llama, qwen2moe and qwen3moe files; they load with the
// config and expert slices the keys say (repacked slice by slice); a token's
// output is the same solo, batched, chunked and after a prefix hit (f32 and
// f16 KV); the loaded layers run bit-exactly as the scalar reference; and
// bad files are refused naming the key or tensor. The peer goldens of these
// architectures are in test_golden_arch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "engine/local_sequence.h"
#include "engine/moe_ffn.h"
#include "engine/paged_engine.h"
#include "engine/sampler.h"
#include "gguf_test_util.h"
#include "kernels/cpu.h"
#include "kernels/threadpool.h"
#include "kv/block_storage.h"
#include "model/model.h"
#include "engine_test_util.h"
#include "test_util.h"
#include "small_models.h"
#include "tools/make_model.h"

using namespace kvs;
using namespace kvs::test;

namespace {

std::string tmp(const std::string& name) { return temp_dir() + "/" + name; }

std::string made(const std::string& arch, GgmlType type) {
  const std::string name = arch + "-" + type_name(type) + ".gguf";
  MakeModelOptions o = tiny_moe_options(arch, type, name);
  make_random_model(o);
  return o.out;
}

using test::random_tokens;

}  // namespace

TEST(MoeModel, MixtralStyleLlamaLoads) {
  const std::string p = made("llama", GgmlType::Q8_0);
  auto m = Model::load(p);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.moe.n_expert, 4);
  EXPECT_EQ(c.moe.n_used, 2);
  EXPECT_EQ(c.moe.ffn_dim, 96);  // llama's experts are feed_forward_length wide
  EXPECT_EQ(c.moe.shared_ffn_dim, 0);
  EXPECT_EQ(c.moe.gating, MoeGating::SoftmaxTopK);
  EXPECT_TRUE(c.moe.norm_weights);
  EXPECT_EQ(c.rope, RopeStyle::Normal);
  const LayerWeights& L = m->weights().layers[1];
  EXPECT_EQ(L.w_gate.data, nullptr);
  EXPECT_EQ(L.moe.router.type, GgmlType::F32);
  EXPECT_EQ(L.moe.router.rows, 4);
  ASSERT_EQ(L.moe.gate.size(), 4u);
  ASSERT_EQ(L.moe.down.size(), 4u);
  EXPECT_EQ(L.moe.up[3].rows, 96);
  EXPECT_EQ(L.moe.up[3].cols, 128);
  EXPECT_EQ(L.moe.down[2].rows, 128);
  EXPECT_EQ(L.moe.down[2].cols, 96);
  EXPECT_EQ(L.moe.gate[1].type, GgmlType::Q8_0);
  // Each expert is its own slice of the 3-D tensor, in expert order.
  auto f = GgufFile::open(p);
  const GgufTensorInfo* t = f->find_tensor("blk.1.ffn_down_exps.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dims, (std::vector<int64_t>{96, 128, 4}));
  const size_t slice = t->nbytes / 4;
  for (int e = 0; e < 4; ++e) {
    std::vector<float> got(96), want(96);
    dequantize_weight_row(L.moe.down[size_t(e)], 5, got.data());
    dequantize_row(t->type, t->data + e * slice + 5 * row_bytes(t->type, 96), want.data(), 96);
    EXPECT_EQ(got, want) << "expert " << e;
  }
  if (active_isa() != Isa::Scalar) {
    EXPECT_NE(L.moe.gate[2].pack, PackLayout::None) << "expert slices are repacked like dense matrices";
    EXPECT_NE(L.moe.down[3].pack, PackLayout::None);
    EXPECT_NE(L.moe.router.pack, PackLayout::None);
  }
}

// Quantized expert slices keep their bits when repacked; the F32 router's
// packed copy runs the k-chain order (kernels/matmul_internal.h), so the
// logits move by rounding only.
TEST(MoeModel, RepackedExpertsGiveTheSameResults) {
  if (active_isa() == Isa::Scalar) GTEST_SKIP() << "no packed layout without AVX2";
  const std::string p = made("qwen2moe", GgmlType::Q8_0);
  setenv("KVS_REPACK", "0", 1);
  auto plain = Model::load(p);
  unsetenv("KVS_REPACK");
  auto packed = Model::load(p);
  const MoeConfig& c = plain->config().moe;
  for (int l = 0; l < 2; ++l) {
    const MoeWeights& a = plain->weights().layers[size_t(l)].moe;
    MoeWeights b = packed->weights().layers[size_t(l)].moe;
    ASSERT_EQ(a.gate[1].pack, PackLayout::None);
    ASSERT_NE(b.gate[1].pack, PackLayout::None);
    ASSERT_NE(b.sh_down.pack, PackLayout::None);
    b.router = a.router;  // the same routing: the experts' bits alone are compared
    ThreadPool pool(2);
    MoeFfn moe;
    const int64_t T = 29;
    const std::vector<float> x = [&] {
      std::vector<float> v(size_t(T) * 128);
      std::mt19937 rng{static_cast<uint32_t>(l)};
      std::normal_distribution<float> nd;
      for (float& e : v) e = nd(rng);
      return v;
    }();
    std::vector<float> ya(x.size()), yb(x.size());
    moe.forward(c, a, x.data(), T, 128, ya.data(), pool);
    moe.forward(c, b, x.data(), T, 128, yb.data(), pool);
    EXPECT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * 4)) << "layer " << l << ": repacked experts differ";
  }
  const std::vector<int32_t> prompt = random_tokens(21, plain->config().n_vocab, 5);
  auto logits = [&](const std::shared_ptr<const Model>& m) {
    Engine e(m, EngineOptions{2});
    LocalSequence seq(e, 64);
    std::vector<float> all = seq.eval(prompt, /*all_logits=*/true);  // [n_prompt, n_vocab]
    for (int i = 0; i < 3; ++i) {
      const std::vector<float>& l = seq.eval({int32_t(20 + i)}, false);
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  };
  const std::vector<float> a = logits(plain), b = logits(packed);
  ASSERT_EQ(a.size(), b.size());
  const size_t vocab = size_t(plain->config().n_vocab);
  const auto [max_diff, max_abs] = test::max_diff_and_abs(a, b);
  EXPECT_LE(max_diff, 1e-4 * max_abs) << "max |diff| " << max_diff << " of max |logit| " << max_abs;
  for (size_t row = 0; row < a.size() / vocab; ++row) {
    auto arg = [&](const std::vector<float>& v) {
      return std::max_element(v.begin() + long(row * vocab), v.begin() + long((row + 1) * vocab)) - v.begin();
    };
    EXPECT_EQ(arg(a), arg(b)) << "row " << row;
  }
}

TEST(MoeModel, Qwen2MoeLoadsWithSharedExpert) {
  auto m = Model::load(made("qwen2moe", GgmlType::F16));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "qwen2moe");
  EXPECT_EQ(c.rope, RopeStyle::Neox);
  EXPECT_TRUE(c.has_qkv_bias);
  EXPECT_EQ(c.moe.n_expert, 4);
  EXPECT_EQ(c.moe.ffn_dim, 96);
  EXPECT_EQ(c.moe.shared_ffn_dim, 160);
  EXPECT_FALSE(c.moe.norm_weights);  // qwen2moe keeps the softmax weights of its top k
  const MoeWeights& w = m->weights().layers[1].moe;
  EXPECT_EQ(w.sh_gate.rows, 160);
  EXPECT_EQ(w.sh_down.cols, 160);
  ASSERT_NE(w.sh_gate_inp, nullptr);
  EXPECT_EQ(w.sh_up.type, GgmlType::F16);
}

// solo == batched == chunked, for any block size, f32 and f16 KV.
TEST(MoeModel, TokenOutputIndependentOfBatchAndChunking) {
  for (const char* arch : {"llama", "qwen2moe", "qwen3moe"}) {
    auto model = Model::load(made(arch, GgmlType::Q8_0));
    Engine engine(model, EngineOptions{2});
    const int nv = model->config().n_vocab, n = 37;
    auto toks = random_tokens(n, nv, 11);
    for (KvType kt : {KvType::F32, KvType::F16}) {
      SCOPED_TRACE(std::string(arch) + (kt == KvType::F32 ? " f32 KV" : " f16 KV"));
      KvCacheOptions kc;
      kc.type = kt;
      LocalSequence a(engine, 64, 16, kc);
      const std::vector<float> ref = a.eval(toks, true);  // [n, nv]
      for (int bs : {1, 5, 64})
        for (int chunk : {1, 7, 37}) {
          LocalSequence b(engine, 64, bs, kc);
          const std::vector<float> got = b.eval(toks.data(), n, true, chunk);
          ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * 4)) << "block size " << bs << ", chunk " << chunk;
        }
      // Inside a batch with two other sequences: the experts see other rows.
      const KvLayout lay = kv_layout_for(engine, 16, kc);
      BlockStorage st(lay, 16);
      std::vector<int32_t> t0 = {0, 1, 2, 3}, t1 = {4, 5}, t2 = {6, 7, 8, 9, 10, 11};
      auto o1 = random_tokens(23, nv, 3), o2 = random_tokens(50, nv, 4);
      const auto chunk = test::seq_chunk;
      std::vector<float> lg;
      engine.forward({chunk(t1.data(), o1.data(), 23, false), chunk(t0.data(), toks.data(), n, true),
                      chunk(t2.data(), o2.data(), 50, true)},
                     st.view(), lg);
      ASSERT_EQ(lg.size(), size_t(1 + n + 50) * nv);
      EXPECT_EQ(0, std::memcmp(lg.data() + nv, ref.data(), ref.size() * 4)) << "logits depend on batch composition";
      // Decode after a prefill equals the one-pass logits within rounding of the cache type.
      LocalSequence inc(engine, 64, 16, kc);
      inc.eval(toks.data(), 9, false);
      for (int i = 9; i < n; ++i) {
        const std::vector<float>& l = inc.eval(&toks[size_t(i)], 1);
        ASSERT_EQ(0, std::memcmp(l.data(), &ref[size_t(i) * nv], size_t(nv) * 4)) << "position " << i;
      }
    }
  }
}

// The serving path: a prompt whose prefix is already cached (another
// request's blocks) gives the tokens and bits of the same prompt computed
// cold, and of a private sequence.
TEST(MoeModel, PrefixHitGivesTheColdResult) {
  auto model = Model::load(made("qwen2moe", GgmlType::Q8_0));
  Engine engine(model, EngineOptions{2});
  const int nv = model->config().n_vocab;
  std::vector<int32_t> prefix = random_tokens(40, nv, 21), p1 = prefix, p2 = prefix;
  for (int32_t t : random_tokens(7, nv, 22)) p1.push_back(t);
  for (int32_t t : random_tokens(9, nv, 23)) p2.push_back(t);
  PagedEngineOptions po;
  po.block_size = 16;
  po.n_blocks = 32;
  po.max_ctx = 128;
  const Scope sc = make_scope("", "tenant");
  auto run = [&](PagedEngine& pe, const std::vector<int32_t>& prompt, int* cached) {
    auto a = pe.add(prompt, sc);
    *cached = a.cached_tokens;
    StepResult r = pe.step({{a.seq, uncached_tail(prompt, a)}});
    EXPECT_TRUE(r.ok);
    std::vector<float> logits(r.logits_of(0), r.logits_of(0) + nv);
    std::vector<int32_t> toks;
    for (int i = 0; i < 8; ++i) {
      toks.push_back(argmax(r.logits_of(0), nv));
      r = pe.step({{a.seq, std::span<const int32_t>(&toks.back(), 1)}});
      EXPECT_TRUE(r.ok);
    }
    return std::make_pair(logits, toks);
  };
  int cached = -1;
  PagedEngine cold(engine, po);
  const auto want = run(cold, p2, &cached);
  EXPECT_EQ(cached, 0);
  PagedEngine warm(engine, po);
  run(warm, p1, &cached);
  const auto got = run(warm, p2, &cached);
  EXPECT_EQ(cached, 32);  // two full blocks of the shared prefix
  EXPECT_EQ(got.second, want.second);
  EXPECT_EQ(0, std::memcmp(got.first.data(), want.first.data(), size_t(nv) * 4));
  LocalSequence solo(engine, 128);
  const std::vector<float>& l = solo.eval(p2);
  EXPECT_EQ(0, std::memcmp(l.data(), want.first.data(), size_t(nv) * 4));
}

// qwen3moe: qwen3 attention (per-head q/k RMSNorm, no biases) with experts
// renormalised over the top k; its layer against the scalar reference.
TEST(MoeModel, Qwen3MoeLoadsAndRuns) {
  MakeModelOptions o = tiny_moe_options("qwen3moe", GgmlType::Q8_0, "qwen3moe.gguf");
  o.n_expert = 8;
  o.n_expert_used = 3;
  o.expert_ffn = 64;
  make_random_model(o);
  auto m = Model::load(o.out);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "qwen3moe");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.has_qkv_bias);
  EXPECT_EQ(c.rope, RopeStyle::Neox);
  EXPECT_EQ(c.moe.n_expert, 8);
  EXPECT_EQ(c.moe.n_used, 3);
  EXPECT_EQ(c.moe.ffn_dim, 64);  // expert_feed_forward_length
  EXPECT_EQ(c.moe.shared_ffn_dim, 0);
  EXPECT_EQ(c.moe.gating, MoeGating::SoftmaxTopK);
  EXPECT_TRUE(c.moe.norm_weights);  // qwen3moe renormalises its top k
  const LayerWeights& L = m->weights().layers[1];
  ASSERT_NE(L.q_norm, nullptr);
  ASSERT_EQ(L.moe.gate.size(), 8u);
  EXPECT_EQ(L.moe.gate[7].rows, 64);
  ThreadPool pool(2);
  MoeFfn moe;
  const int64_t T = 19;
  std::vector<float> x(size_t(T) * 128), got(x.size()), want(x.size());
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  moe.forward(c.moe, L.moe, x.data(), T, 128, got.data(), pool);
  moe_ffn_reference(c.moe, L.moe, x.data(), T, 128, want.data());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4));
  // Without expert_feed_forward_length the experts are feed_forward_length / k wide, as in the peers.
  const std::string p2 = tmp("qwen3moe-nokey.gguf");
  rewrite_gguf(o.out, p2, nullptr, nullptr, [](const std::string& k) { return k != "qwen3moe.expert_feed_forward_length"; });
  EXPECT_EQ(config_from_gguf(*GgufFile::open(p2)).moe.ffn_dim, 96 / 3);
}

namespace {

void expect_refused(const std::string& src, const std::string& name, const std::function<void(GgufWriter&)>& kv,
                    const std::function<bool(TensorCopy&)>& tensor, std::initializer_list<const char*> parts,
                    const std::function<bool(const std::string&)>& keep = nullptr) {
  const std::string p = tmp(name);
  rewrite_gguf(src, p, kv, tensor, keep);
  const std::string e = model_error([&] { Model::load(p); });
  ASSERT_FALSE(e.empty()) << name << " loaded without error";
  EXPECT_NE(e.find(p), std::string::npos) << "no file name in: " << e;
  for (const char* s : parts) EXPECT_NE(e.find(s), std::string::npos) << name << ": missing '" << s << "' in: " << e;
}

}  // namespace

TEST(MoeModel, BadFilesAreRefusedNamingKeyOrTensor) {
  const std::string llama = made("llama", GgmlType::F16), qwen = made("qwen2moe", GgmlType::F16);
  EXPECT_NO_THROW(Model::load(llama));
  expect_refused(llama, "no-up.gguf", nullptr, [](TensorCopy& t) { return t.name != "blk.1.ffn_up_exps.weight"; },
                 {"tensor 'blk.1.ffn_up_exps.weight' is missing"});
  expect_refused(llama, "used.gguf", [](GgufWriter& w) { w.set_u32("llama.expert_used_count", 5); }, nullptr,
                 {"'llama.expert_used_count' = 5", "exceeds expert_count 4"});
  expect_refused(llama, "no-count.gguf", nullptr, nullptr, {"'llama.expert_count'", "missing"},
                 [](const std::string& k) { return k != "llama.expert_count"; });
  expect_refused(llama, "no-used.gguf", nullptr, nullptr, {"'llama.expert_used_count'", "missing"},
                 [](const std::string& k) { return k != "llama.expert_used_count"; });
  expect_refused(llama, "shape.gguf", nullptr,
                 [](TensorCopy& t) {
                   if (t.name == "blk.0.ffn_down_exps.weight") t.dims = {128, 96, 4};  // was {96, 128, 4}
                   return true;
                 },
                 {"'blk.0.ffn_down_exps.weight' has shape [128, 96, 4], expected [96, 128, 4]"});
  expect_refused(llama, "count.gguf", [](GgufWriter& w) { w.set_u32("llama.expert_count", 5); }, nullptr,
                 {"'blk.0.ffn_gate_inp.weight' has shape [128, 4], expected [128, 5]"});
  expect_refused(llama, "gating.gguf", [](GgufWriter& w) { w.set_u32("llama.expert_gating_func", 2); }, nullptr,
                 {"'llama.expert_gating_func' = 2", "not supported"});
  expect_refused(llama, "norm.gguf", [](GgufWriter& w) { w.set_bool("llama.expert_weights_norm", false); }, nullptr,
                 {"'llama.expert_weights_norm' = false", "not supported"});
  expect_refused(llama, "scale.gguf", [](GgufWriter& w) { w.set_f32("llama.expert_weights_scale", 2.5f); }, nullptr,
                 {"'llama.expert_weights_scale'", "not supported"});
  expect_refused(qwen, "qnorm.gguf", [](GgufWriter& w) { w.set_bool("qwen2moe.expert_weights_norm", true); }, nullptr,
                 {"'qwen2moe.expert_weights_norm' = true", "not supported"});
  // A router without the keys, and the keys without a router.
  expect_refused(llama, "no-router.gguf", nullptr,
                 [](TensorCopy& t) { return t.name.find("ffn_gate_inp") == std::string::npos; },
                 {"'blk.0.ffn_gate_inp.weight' is missing", "'llama.expert_count' = 4"});
  // Tensors a MoE layer would ignore.
  const auto add_f32 = [](const std::string& name, std::vector<int64_t> dims) {
    return [name, dims](GgufWriter& w) {
      int64_t n = 1;
      for (int64_t d : dims) n *= d;
      std::vector<float> v(size_t(n), 0.5f);
      w.add_tensor_f32(name, GgmlType::F32, dims, v.data());
    };
  };
  expect_refused(llama, "dense-too.gguf", add_f32("blk.0.ffn_gate.weight", {128, 96}), nullptr,
                 {"'blk.0.ffn_gate.weight' is in the file", "does not use it"});
  expect_refused(qwen, "no-shgate.gguf", nullptr,
                 [](TensorCopy& t) { return t.name != "blk.1.ffn_gate_inp_shexp.weight"; },
                 {"tensor 'blk.1.ffn_gate_inp_shexp.weight' is missing"});
  expect_refused(qwen, "no-shared-len.gguf", nullptr, nullptr, {"'qwen2moe.expert_shared_feed_forward_length'", "missing"},
                 [](const std::string& k) {
                   return k != "qwen2moe.expert_shared_feed_forward_length" && k != "qwen2moe.feed_forward_length";
                 });
  expect_refused(qwen, "no-bias.gguf", nullptr, [](TensorCopy& t) { return t.name.find(".bias") == std::string::npos; },
                 {"tensor 'blk.0.attn_q.bias' is missing"});
  expect_refused(qwen, "no-experts.gguf", nullptr, nullptr, {"'qwen2moe.expert_count'", "missing"},
                 [](const std::string& k) { return k != "qwen2moe.expert_count"; });
  // A llama MoE has no shared expert: its tensors would be ignored.
  expect_refused(llama, "llama-shexp.gguf", add_f32("blk.1.ffn_gate_inp_shexp.weight", {128}), nullptr,
                 {"'blk.1.ffn_gate_inp_shexp.weight' is in the file", "does not use it"});
  // Expert biases (gpt-oss has them; these architectures do not).
  expect_refused(qwen, "exp-bias.gguf", add_f32("blk.0.ffn_down_exps.bias", {128, 4}), nullptr,
                 {"'blk.0.ffn_down_exps.bias' is in the file", "does not use it"});
}

TEST(MoeModel, MakeModelCommandLine) {
  std::string out, err;
  const std::string p = tmp("cli-moe.gguf");
  ASSERT_EQ(run_kvserve({"make-model", "-o", p, "--experts", "6", "--experts-used", "3", "-q"}, &out, &err), 0) << err;
  auto f = GgufFile::open(p);
  EXPECT_EQ(f->get_u64("llama.expert_count"), 6u);
  EXPECT_EQ(f->get_u64("llama.expert_used_count"), 3u);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up_exps.weight")->dims, (std::vector<int64_t>{64, 192, 6}));
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate_inp.weight")->type, GgmlType::F32);
  // qwen2moe alone gives a valid file: 8 experts, top 2, a shared expert.
  const std::string q = tmp("cli-qwen2moe.gguf");
  ASSERT_EQ(run_kvserve({"make-model", "-o", q, "--arch", "qwen2moe", "-q"}, &out, &err), 0) << err;
  auto m = Model::load(q);
  EXPECT_EQ(m->config().moe.n_expert, 8);
  EXPECT_EQ(m->config().moe.n_used, 2);
  EXPECT_EQ(m->config().moe.shared_ffn_dim, 192);
  // Flags that cannot be honoured name the flag.
  EXPECT_NE(run_kvserve({"make-model", "-o", tmp("x.gguf"), "--experts", "2", "--experts-used", "3", "-q"}, &out, &err), 0);
  EXPECT_NE(err.find("--experts-used 3 exceeds --experts 2"), std::string::npos) << err;
  EXPECT_NE(run_kvserve({"make-model", "-o", tmp("x.gguf"), "--experts-used", "2", "-q"}, &out, &err), 0);
  EXPECT_NE(err.find("--experts-used needs --experts"), std::string::npos) << err;
  EXPECT_NE(run_kvserve({"make-model", "-o", tmp("x.gguf"), "--experts", "4", "--shared-ffn", "64", "-q"}, &out, &err), 0);
  EXPECT_NE(err.find("--shared-ffn needs --arch qwen2moe"), std::string::npos) << err;
}
