// The paged engine with real models: logits through a shared, paged pool are
// bit-identical to LocalSequence's private contiguous blocks (any block
// size, interleaved with other sequences), the stories260K goldens still
// pass, a cached prefix is not recomputed yet gives identical output, forks
// share their prompt's blocks and never see each other's tokens, and bad
// sizes / an exhausted pool are reported, not fatal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/local_sequence.h"
#include "engine/paged_engine.h"
#include "engine/sampler.h"
#include "kernels/cpu.h"
#include "model/model.h"
#include "engine_test_util.h"
#include "test_util.h"

using namespace kvs;
using V = std::vector<int32_t>;

namespace {

const char* kModels[] = {"stories260K/stories260K.gguf", "tiny-random/tiny-llama-f16.gguf",
                         "tiny-random/tiny-llama-q4_0.gguf", "tiny-random/tiny-qwen2-q8_0.gguf",
                         "tiny-random/tiny-qwen2-q4_k_m.gguf"};

using test::random_tokens;

double max_abs(const float* a, const float* b, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; ++i) w = std::max(w, std::fabs(double(a[i]) - b[i]));
  return w;
}

std::shared_ptr<const Model> load(const std::string& rel) { return Model::load(test::shared("models/" + rel)); }

PagedEngineOptions opts(int bs, int64_t n_blocks, int max_ctx, bool caching = true) {
  PagedEngineOptions o;
  o.block_size = bs;
  o.n_blocks = n_blocks;
  o.max_ctx = max_ctx;
  o.prefix_caching = caching;
  return o;
}

// Logits of the last token of one step item, copied.
std::vector<float> last_logits(const StepResult& r, size_t item) {
  const float* p = r.logits_of(item);
  return std::vector<float>(p, p + r.n_vocab);
}

// Prefill (uncached part) then greedy decode of n tokens; returns the tokens
// and the first logits row (after the prompt).
struct GreedyRun {
  V tokens;
  std::vector<float> first_logits;
  int cached = 0;
};
GreedyRun greedy(PagedEngine& pe, const V& prompt, int n, const Scope& sc = {}, bool release = true) {
  GreedyRun out;
  auto a = pe.add(prompt, sc);
  out.cached = a.cached_tokens;
  StepResult r = pe.step({{a.seq, uncached_tail(prompt, a)}});
  EXPECT_TRUE(r.ok);
  out.first_logits = last_logits(r, 0);
  for (int i = 0; i < n; ++i) {
    const int32_t t = argmax(r.logits_of(0), r.n_vocab);
    out.tokens.push_back(t);
    if (i + 1 == n) break;
    r = pe.step({{a.seq, std::span<const int32_t>(&out.tokens.back(), 1)}});
    EXPECT_TRUE(r.ok);
  }
  if (release) pe.release(a.seq);
  return out;
}

class PagedModels : public ::testing::TestWithParam<const char*> {};

// Same tokens -> same bits as the contiguous LocalSequence, for block sizes
// 1, 16 and 64, while another sequence's blocks interleave with ours.
void expect_paged_equals_contiguous(const std::shared_ptr<const Model>& model) {
  Engine engine(model, EngineOptions{2});
  const int nv = model->config().n_vocab;
  const int n = 90, n_prompt = 37;
  V toks = random_tokens(n, nv, 5), other = random_tokens(n, nv, 6);
  LocalSequence ref_seq(engine, 128);
  const std::vector<float> ref = ref_seq.eval(toks, true);  // [n, nv]

  for (int bs : {1, 16, 64}) {
    SCOPED_TRACE("block size " + std::to_string(bs));
    PagedEngine pe(engine, opts(bs, 2 * ((128 + bs - 1) / bs) + 2, 128));
    auto a = pe.add(std::span(toks).first(n_prompt));
    auto b = pe.add(std::span(other).first(5));
    ASSERT_EQ(a.cached_tokens, 0);
    // Prefill a with all logits, in the same batch as b's prompt.
    StepResult r = pe.step({{b.seq, std::span(other).first(5)}, {a.seq, std::span(toks).first(n_prompt), true}});
    ASSERT_TRUE(r.ok);
    ASSERT_EQ(0, std::memcmp(r.logits_of(1, 0), ref.data(), size_t(n_prompt) * nv * sizeof(float)))
        << "prefill logits differ bitwise";
    for (int i = n_prompt; i < n; ++i) {
      r = pe.step({{a.seq, std::span(toks).subspan(i, 1)}, {b.seq, std::span(other).subspan(5 + i - n_prompt, 1)}});
      ASSERT_TRUE(r.ok);
      const float* got = r.logits_of(0);
      ASSERT_LT(max_abs(got, &ref[size_t(i) * nv], nv), 1e-5) << "position " << i;
      ASSERT_EQ(0, std::memcmp(got, &ref[size_t(i) * nv], nv * sizeof(float))) << "position " << i;
    }
    // b reserved first, so a's table is not the identity 0, 1, 2, ...
    EXPECT_NE(pe.kv().block_table(a.seq)[0], 0);
    pe.kv().check_invariants(true);
  }
}

TEST_P(PagedModels, BitIdenticalToContiguousPath) { expect_paged_equals_contiguous(load(GetParam())); }

// With --prefill-precision bf16 (float weights and attention on AMX-BF16
// tiles) a token's logits still do not depend on the batch, the chunk or
// the other sequences.
TEST(PagedEngine, Bf16ProductsStayBatchIndependent) {
  if (!amx_bf16_active()) GTEST_SKIP() << "no AMX-BF16 here: --prefill-precision bf16 is refused, nothing to check";
  // bf16 matmuls (F32, F16 weights), bf16 attention (head_dim 32: the
  // F16 and the Q8_0 model, whose matmuls stay exact).
  for (const char* rel : {"stories260K/stories260K.gguf", "tiny-random/tiny-llama-f16.gguf",
                          "tiny-random/tiny-qwen2-q8_0.gguf"}) {
    SCOPED_TRACE(rel);
    auto model = Model::load(test::shared(std::string("models/") + rel), "", nullptr, MatmulPrecision::Bf16);
    ASSERT_EQ(model->precision(), MatmulPrecision::Bf16);
    expect_paged_equals_contiguous(model);
  }
}

// A fully cached prompt still yields its logits (one token recomputed), bit
// for bit those of a cold run.
TEST_P(PagedModels, FullyCachedPromptRecomputesOneToken) {
  auto model = load(GetParam());
  Engine engine(model, EngineOptions{2});
  V prompt = random_tokens(48, model->config().n_vocab, 9);  // 3 full blocks of 16
  PagedEngine pe(engine, opts(16, 32, 256));
  GreedyRun cold = greedy(pe, prompt, 8);
  const int64_t before = pe.stats().forward_tokens;
  GreedyRun warm = greedy(pe, prompt, 8);
  EXPECT_EQ(warm.cached, 47);
  EXPECT_EQ(pe.stats().forward_tokens - before, 1 + 7);  // last prompt token + 7 decode steps
  EXPECT_EQ(0, std::memcmp(warm.first_logits.data(), cold.first_logits.data(), cold.first_logits.size() * sizeof(float)));
  EXPECT_EQ(warm.tokens, cold.tokens);
  pe.kv().check_invariants(true);
}

INSTANTIATE_TEST_SUITE_P(AllModels, PagedModels, ::testing::ValuesIn(kModels));

// stories260K goldens (llama2.c run.c, greedy) token for token through the
// paged engine, with block sizes 16 and 1, and again with a warm cache.
TEST(PagedEngine, Stories260KGoldensTokenForToken) {
  auto model = load("stories260K/stories260K.gguf");
  Engine engine(model, EngineOptions{2});
  std::vector<std::string> files;
  for (auto& e : std::filesystem::directory_iterator(test::shared("golden/stories260K")))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 5u);
  for (int bs : {16, 1}) {
    PagedEngine pe(engine, opts(bs, 6000 / bs + 64, 512));  // no eviction: pass 2 hits
    for (int pass = 0; pass < 2; ++pass) {
      for (const auto& f : files) {
        SCOPED_TRACE(f + " block size " + std::to_string(bs) + " pass " + std::to_string(pass));
        auto g = nlohmann::json::parse(test::read_file(f));
        V prompt = g["prompt_tokens"].get<V>();
        V expect = g["generated"].get<V>();
        // run.c samples at positions prompt-1 .. steps-1 and stops after a
        // sampled BOS (1); the goldens list every sample, that BOS included.
        const int budget = g["steps"].get<int>() - int(prompt.size()) + 1;
        auto a = pe.add(prompt);
        if (pass == 1 && bs == 1) {
          EXPECT_EQ(a.cached_tokens, int(prompt.size()) - 1);
        }
        StepResult r = pe.step({{a.seq, uncached_tail(prompt, a)}});
        ASSERT_TRUE(r.ok);
        V got;
        for (int i = 0; i < budget; ++i) {
          got.push_back(argmax(r.logits_of(0), r.n_vocab));
          if (got.back() == 1 || i + 1 == budget) break;
          r = pe.step({{a.seq, std::span<const int32_t>(&got.back(), 1)}});
          ASSERT_TRUE(r.ok);
        }
        EXPECT_EQ(got, expect);
        pe.release(a.seq);
      }
    }
    pe.kv().check_invariants(true);
  }
}

// Two requests share a 300-token prefix: the second prefills only what is
// not in whole cached blocks and its output equals a cold run's.
TEST(PagedEngine, SharedPrefixPrefillsOnlyNewTokens) {
  auto model = load("stories260K/stories260K.gguf");
  Engine engine(model, EngineOptions{2});
  const int nv = model->config().n_vocab;
  V prefix = random_tokens(300, nv, 21);
  V p1 = prefix, p2 = prefix;
  for (int32_t t : random_tokens(20, nv, 22)) p1.push_back(t);
  for (int32_t t : random_tokens(25, nv, 23)) p2.push_back(t);
  const Scope sc = make_scope("", "tenant-1");
  for (int bs : {1, 4, 16}) {
    SCOPED_TRACE("block size " + std::to_string(bs));
    PagedEngine cold_pe(engine, opts(bs, 2 * (512 / bs) + 4, 512));
    GreedyRun cold = greedy(cold_pe, p2, 16, sc);
    EXPECT_EQ(cold_pe.stats().forward_tokens, 325 + 15);

    PagedEngine pe(engine, opts(bs, 2 * (512 / bs) + 4, 512));
    GreedyRun first = greedy(pe, p1, 16, sc, /*release=*/false);  // still running while the second arrives
    const int64_t before = pe.stats().forward_tokens;
    GreedyRun second = greedy(pe, p2, 16, sc);
    const int shared = 300 / bs * bs;
    EXPECT_EQ(second.cached, shared);
    EXPECT_EQ(pe.stats().forward_tokens - before, (325 - shared) + 15) << "tokens through the model";
    if (bs != 16) {
      EXPECT_EQ(pe.stats().forward_tokens - before, 25 + 15);
    }
    EXPECT_EQ(second.tokens, cold.tokens);
    EXPECT_EQ(0, std::memcmp(second.first_logits.data(), cold.first_logits.data(), size_t(nv) * sizeof(float)));
    // A different tenant scope shares nothing.
    auto other = pe.add(p2, make_scope("", "tenant-2"));
    EXPECT_EQ(other.cached_tokens, 0);
    EXPECT_EQ(pe.stats().kv.prefix_hit_tokens, shared);
    EXPECT_EQ(pe.kv().cached_prefix_blocks(p2, pe.kv_scope(sc)), 325 / bs);  // the second run cached all of p2
    EXPECT_EQ(pe.kv().cached_prefix_blocks(p2, sc), 0);  // the model identity is part of the key
    pe.kv().check_invariants(true);
  }
}

// n = 4 completions: the prompt's blocks are stored once; siblings diverge
// (different sampled tokens) and each one's logits equal a private run of
// exactly its own tokens, so none sees another's.
TEST(PagedEngine, FourCompletionsShareThePromptAndStayIsolated) {
  auto model = load("stories260K/stories260K.gguf");
  Engine engine(model, EngineOptions{2});
  const int nv = model->config().n_vocab, bs = 16;
  V prompt = random_tokens(100, nv, 31);  // 6 full blocks + 4 tokens
  PagedEngine pe(engine, opts(bs, 64, 512));
  auto a = pe.add(prompt);
  StepResult r = pe.step({{a.seq, prompt}});
  ASSERT_TRUE(r.ok);
  const std::vector<float> prompt_logits = last_logits(r, 0);
  std::vector<SeqId> seqs = {a.seq};
  for (int i = 0; i < 3; ++i) seqs.push_back(pe.fork(a.seq));
  EXPECT_EQ(pe.stats().kv.used_blocks, 7);  // 4 × 100 tokens held in 7 blocks
  EXPECT_EQ(pe.kv().seq_info(seqs[3]).shared_blocks, 7);

  std::vector<V> hist(4, prompt);
  std::vector<Sampler> samplers;
  for (int i = 0; i < 4; ++i) samplers.emplace_back(SamplingParams{1.0f, 0, 1.0f, 0.0f, 1.0f, 64, uint64_t(100 + i)});
  std::vector<std::vector<float>> logits(4, prompt_logits);
  const int steps = 20;
  for (int s = 0; s < steps; ++s) {
    std::vector<SeqStep> items;
    for (int i = 0; i < 4; ++i) {
      std::vector<int> h(hist[i].begin(), hist[i].end());
      hist[i].push_back(samplers[i].sample(logits[i].data(), nv, h));
    }
    for (int i = 0; i < 4; ++i) items.push_back({seqs[i], std::span<const int32_t>(&hist[i].back(), 1)});
    r = pe.step(items);
    ASSERT_TRUE(r.ok);
    for (int i = 0; i < 4; ++i) logits[i] = last_logits(r, i);
    if (s == 0) {  // each but the last copied the shared partial block
      EXPECT_EQ(pe.stats().kv.used_blocks, 6 + 4);
    }
  }
  // 120 tokens each: 6 shared full blocks + 2 private blocks per sequence.
  EXPECT_EQ(pe.stats().kv.used_blocks, 6 + 4 * 2);
  EXPECT_EQ(pe.stats().kv.cow_copies, 3);  // the last writer owned the partial block alone
  EXPECT_NE(hist[0], hist[1]);
  for (int i = 0; i < 4; ++i) {
    LocalSequence solo(engine, 512);
    const std::vector<float>& want = solo.eval(hist[i].data(), int(hist[i].size()));
    EXPECT_EQ(0, std::memcmp(want.data(), logits[i].data(), size_t(nv) * sizeof(float))) << "completion " << i;
  }
  pe.kv().check_invariants(true);
  for (SeqId s : seqs) pe.release(s);
  EXPECT_EQ(pe.stats().kv.used_blocks, 0);
}

TEST(PagedEngine, BadSizesAndExhaustionAreReported) {
  EXPECT_THROW(check_block_size_option(4), std::invalid_argument);
  EXPECT_THROW(check_block_size_option(512), std::invalid_argument);
  EXPECT_NO_THROW(check_block_size_option(8));
  EXPECT_NO_THROW(check_block_size_option(256));
  auto model = load("stories260K/stories260K.gguf");
  Engine engine(model, EngineOptions{1});
  EXPECT_THROW({ PagedEngine pe(engine, opts(0, 64, 512)); }, std::invalid_argument);
  EXPECT_THROW({ PagedEngine pe(engine, opts(300, 64, 512)); }, std::invalid_argument);
  // 512-token context at block size 16 needs 32 blocks.
  EXPECT_THROW({ PagedEngine pe(engine, opts(16, 31, 512)); }, std::invalid_argument);
  PagedEngineOptions o;
  o.block_size = 16;
  o.max_ctx = 512;
  o.kv_memory_bytes = 1000;  // smaller than one block
  try {
    PagedEngine pe(engine, o);
    FAIL() << "no error for a tiny budget";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-memory"), std::string::npos) << e.what();
  }
  // A budget of exactly 32 blocks is accepted.
  const ModelConfig& c = model->config();
  o.kv_memory_bytes = KvLayout{c.n_layers, c.n_kv_heads, c.head_dim, 16}.block_bytes() * 32;
  EXPECT_EQ(PagedEngine(engine, o).n_blocks(), 32);

  PagedEngine pe(engine, opts(16, 32, 512));
  V big = random_tokens(500, c.n_vocab, 1);
  auto a = pe.add(big);
  ASSERT_TRUE(pe.step({{a.seq, big}}).ok);  // 32 blocks, all used
  auto b = pe.add(V{1, 2, 3});
  StepResult r = pe.step({{b.seq, V{1, 2, 3}}});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.no_room, std::vector<SeqId>{b.seq});
  EXPECT_EQ(pe.kv().num_tokens(b.seq), 0);
  EXPECT_THROW(pe.step({{a.seq, V(13, 5)}}), std::length_error);  // past the context
  pe.release(a.seq);
  EXPECT_TRUE(pe.step({{b.seq, V{1, 2, 3}}}).ok);
  EXPECT_THROW(pe.add(V{}), std::invalid_argument);
  EXPECT_THROW(pe.add(V{c.n_vocab}), std::invalid_argument);
  pe.kv().check_invariants(true);
}

}  // namespace
