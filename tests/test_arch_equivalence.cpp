// Every architecture computes a token's logits the same way alone, in a
// batch with other sequences, under any prefill chunking and block size,
// after a prefill-then-decode (the test_kv_equivalence pattern) and after a
// prefix-cache hit in the paged pool, on models
// made at test time with windows much shorter than the sequences, so that
// windowed and global layers, both RoPE kinds, soft-caps and QK norms all
// take part, and mixture-of-experts layers: qwen3moe's, and gpt-oss's with
// its learned sinks, YaRN and MXFP4 experts. f32 and f16 caches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/local_sequence.h"
#include "engine/paged_engine.h"
#include "kv/block_storage.h"
#include "model/model.h"
#include "engine_test_util.h"
#include "test_util.h"
#include "tools/make_model.h"

using namespace kvs;

namespace {

struct ArchCase {
  const char* arch;
  int layers, window;
};

std::string make(const ArchCase& a) {
  MakeModelOptions o;
  o.out = test::temp_dir() + "/eq-" + a.arch + ".gguf";
  o.arch = a.arch;
  o.dim = 64;
  o.n_layers = a.layers;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.n_ctx = 128;
  o.type = GgmlType::Q8_0;
  o.progress = false;
  if (a.window > 0) o.window = a.window;
  if (std::string(a.arch) == "gemma2") o.attn_softcap = 3.f, o.final_softcap = 4.f;  // caps that bite
  if (std::string(a.arch) == "qwen3" || std::string(a.arch) == "gemma3") o.head_dim = 32;
  if (std::string(a.arch) == "llama") o.rope_factors = true, o.rope_scaling = "yarn", o.rope_scale = 2;
  if (std::string(a.arch) == "phi3") o.rope_factors = true, o.rope_orig_ctx = 32;
  make_random_model(o);
  return o.out;
}

using test::random_tokens;

class ArchEquivalence : public ::testing::TestWithParam<ArchCase> {};

TEST_P(ArchEquivalence, SoloBatchedChunkedAndDecodeAgree) {
  auto model = Model::load(make(GetParam()));
  Engine engine(model, EngineOptions{2});
  const ModelConfig& c = model->config();
  const int nv = c.n_vocab, n = 45;
  const auto toks = random_tokens(n, nv, 7);
  for (KvType type : {KvType::F32, KvType::F16}) {
    SCOPED_TRACE(to_string(type));
    KvCacheOptions kvo;
    kvo.type = type;
    LocalSequence a(engine, 64, 16, kvo);
    const std::vector<float> ref = a.eval(toks, true);  // [n, nv]
    for (int bs : {1, 5, 16})
      for (int chunk : {1, 7, 45}) {
        LocalSequence b(engine, 64, bs, kvo);
        const std::vector<float> got = b.eval(toks.data(), n, true, chunk);
        ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)))
            << "block size " << bs << ", chunk " << chunk << ": logits differ bitwise";
      }
    // Prefill a prefix, then decode one token at a time: the cache holds what a full pass computes.
    LocalSequence inc(engine, 64, 16, kvo);
    inc.eval(toks.data(), 9, false);
    for (int i = 9; i < n; ++i) {
      const std::vector<float>& lg = inc.eval(&toks[size_t(i)], 1);
      ASSERT_EQ(0, std::memcmp(lg.data(), &ref[size_t(i) * nv], size_t(nv) * sizeof(float))) << "position " << i;
    }
  }
  // Inside a batch with two other sequences of other lengths (no window policy
  // of the model's own: a model-wide window is exercised by LocalSequence above).
  if (c.sliding_window > 0) return;
  LocalSequence solo(engine, 64, 16);
  const std::vector<float> ref = solo.eval(toks, true);
  KvLayout lay{c.n_layers, c.n_kv_heads, c.head_dim, 16};
  BlockStorage st(lay, 16);
  std::vector<int32_t> t0 = {0, 1, 2}, t1 = {4, 5}, t2 = {6, 7, 8, 9};
  const auto o1 = random_tokens(23, nv, 3), o2 = random_tokens(50, nv, 4);
  const auto chunk = test::seq_chunk;
  std::vector<float> lg;
  engine.forward({chunk(t1.data(), o1.data(), 23, false), chunk(t0.data(), toks.data(), n, true),
                  chunk(t2.data(), o2.data(), 50, true)},
                 st.view(), lg);
  ASSERT_EQ(lg.size(), size_t(1 + n + 50) * nv);
  EXPECT_EQ(0, std::memcmp(lg.data() + nv, ref.data(), ref.size() * sizeof(float))) << "logits depend on the batch";
}

// The same prompt twice through the paged pool: the second run takes its
// full blocks from the prefix cache and gives the first run's last logits.
TEST_P(ArchEquivalence, PrefixHitGivesTheSameLogits) {
  auto model = Model::load(make(GetParam()));
  Engine engine(model, EngineOptions{2});
  PagedEngineOptions po;
  po.block_size = 16;
  po.n_blocks = 64;
  po.max_ctx = 128;
  PagedEngine pe(engine, po);
  const int nv = model->config().n_vocab;
  const auto prompt = random_tokens(45, nv, 9);
  auto run = [&](int& cached) {
    const SeqAdmission a = pe.add(prompt);
    cached = a.cached_tokens;
    const StepResult r = pe.step({{a.seq, uncached_tail(prompt, a)}});
    EXPECT_TRUE(r.ok);
    std::vector<float> last(r.logits_of(0), r.logits_of(0) + nv);
    pe.release(a.seq);
    return last;
  };
  int c1 = -1, c2 = -1;
  const std::vector<float> first = run(c1), second = run(c2);
  EXPECT_EQ(c1, 0);
  EXPECT_EQ(c2, 32);  // two full blocks of 16
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)));
}

// Two layers of each kind, windows shorter than the 45-token sequences.
INSTANTIATE_TEST_SUITE_P(Archs, ArchEquivalence,
                         ::testing::Values(ArchCase{"llama", 2, 0}, ArchCase{"mistral", 2, 12},
                                           ArchCase{"qwen3", 2, 0}, ArchCase{"gemma2", 4, 10},
                                           ArchCase{"gemma3", 12, 13}, ArchCase{"phi3", 2, 11},
                                           ArchCase{"qwen3moe", 2, 0}, ArchCase{"gpt-oss", 4, 10}),
                         [](const auto& i) {
                           std::string s = i.param.arch;
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

}  // namespace
