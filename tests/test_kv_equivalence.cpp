// The KV cache must not change the numbers: for every model, logits from
// prefill-then-decode equal logits from recomputing the whole sequence in one
// pass, at every position; and a token's logits do not depend on how the
// prompt was chunked, on the block size, or on what else is in the batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/kv_eval.h"
#include "engine/local_sequence.h"
#include "engine/perplexity.h"
#include "kv/block_storage.h"
#include "model/model.h"
#include "engine_test_util.h"
#include "test_util.h"

using namespace kvs;

namespace {

const char* kModels[] = {"stories260K/stories260K.gguf", "stories260K/stories260K.bin",
                         "tiny-random/tiny-llama-f16.gguf", "tiny-random/tiny-llama-q4_0.gguf",
                         "tiny-random/tiny-qwen2-q8_0.gguf", "tiny-random/tiny-qwen2-q4_k_m.gguf"};

using test::random_tokens;

double max_rel(const float* a, const float* b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(double(b[i]))));
  return worst;
}

class KvEquivalence : public ::testing::TestWithParam<const char*> {};

TEST_P(KvEquivalence, DecodeEqualsFullRecompute) {
  auto model = Model::load(test::shared(std::string("models/") + GetParam()));
  Engine engine(model, EngineOptions{2});
  const int nv = model->config().n_vocab;
  const int n = 40;
  auto toks = random_tokens(n, nv, 7);
  LocalSequence full(engine, 64);
  std::vector<float> ref = full.eval(toks, true);  // [n, nv], one pass, no reuse of cache between steps
  LocalSequence inc(engine, 64);
  inc.eval(toks.data(), 9, false);  // prefill a prefix, then decode one by one
  for (int i = 9; i < n; ++i) {
    const std::vector<float>& lg = inc.eval(&toks[i], 1);
    ASSERT_LT(max_rel(lg.data(), &ref[size_t(i) * nv], nv), 1e-4) << "position " << i;
  }
}

TEST_P(KvEquivalence, IndependentOfChunkingBlockSizeAndBatch) {
  auto model = Model::load(test::shared(std::string("models/") + GetParam()));
  Engine engine(model, EngineOptions{2});
  const int nv = model->config().n_vocab;
  const int n = 37;
  auto toks = random_tokens(n, nv, 11);
  LocalSequence a(engine, 64, 16);
  std::vector<float> ref = a.eval(toks, true);
  for (int bs : {1, 5, 64}) {
    for (int chunk : {1, 7, 37}) {
      LocalSequence b(engine, 64, bs);
      std::vector<float> got = b.eval(toks.data(), n, true, chunk);
      ASSERT_EQ(got.size(), ref.size());
      EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)))
          << "block size " << bs << ", chunk " << chunk << ": logits differ bitwise";
    }
  }
  // The same sequence inside a batch with two other sequences of other lengths.
  const auto& c = model->config();
  KvLayout lay{c.n_layers, c.n_kv_heads, c.head_dim, 16};
  BlockStorage st(lay, 16);
  std::vector<int32_t> t0 = {0, 1, 2, 3}, t1 = {4, 5}, t2 = {6, 7, 8, 9, 10, 11};
  auto o1 = random_tokens(23, nv, 3), o2 = random_tokens(50, nv, 4);
  std::vector<float> lg;
  const auto chunk = test::seq_chunk;
  engine.forward({chunk(t1.data(), o1.data(), 23, false), chunk(t0.data(), toks.data(), n, true),
                  chunk(t2.data(), o2.data(), 50, true)},
                 st.view(), lg);
  ASSERT_EQ(lg.size(), size_t(1 + n + 50) * nv);
  EXPECT_EQ(0, std::memcmp(lg.data() + nv, ref.data(), ref.size() * sizeof(float)))
      << "logits depend on batch composition";
}

INSTANTIATE_TEST_SUITE_P(AllModels, KvEquivalence, ::testing::ValuesIn(kModels));

}  // namespace

// A prompt longer than LocalSequence::kDefaultChunk runs in several forwards
// by default: the same bits as one forward over all of it, every position's
// logits there, and the last token's alone without all_logits.
TEST(KvEquivalenceDefaultChunk, LongPromptSplitsWithSameBits) {
  auto model = Model::load(test::shared("models/tiny-random/tiny-llama-q4_0.gguf"));
  Engine engine(model, EngineOptions{2});
  const int nv = model->config().n_vocab;
  const int n = LocalSequence::kDefaultChunk + 77;
  auto toks = random_tokens(n, nv, 5);
  LocalSequence one(engine, n, 16);
  const std::vector<float> ref = one.eval(toks.data(), n, true, n);  // one forward
  LocalSequence split(engine, n, 16);
  const std::vector<float> got = split.eval(toks.data(), n, true);  // kDefaultChunk, then the rest
  ASSERT_EQ(got.size(), size_t(n) * nv);
  EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)));
  LocalSequence last(engine, n, 16);
  const std::vector<float> tail = last.eval(toks.data(), n);
  ASSERT_EQ(tail.size(), size_t(nv));
  EXPECT_EQ(0, std::memcmp(tail.data(), ref.data() + size_t(n - 1) * nv, size_t(nv) * sizeof(float)));
}

// Perplexity and kv_eval score a long context a piece at a time (no
// [ctx, n_vocab] logits, none for the unscored half): the same NLL as
// every position's logits from one forward, summed in the same order.
TEST(KvEquivalenceDefaultChunk, PerplexityScoresLongContextsByPieces) {
  auto model = Model::load(test::shared("models/tiny-random/tiny-llama-q4_0.gguf"));
  Engine engine(model, EngineOptions{2});
  const int nv = model->config().n_vocab;
  const int ctx = 2 * LocalSequence::kDefaultChunk + 200;  // scored half: two pieces
  const std::vector<int32_t> toks = random_tokens(ctx, nv, 9);  // one chunk
  double nll = 0;
  int64_t scored = 0;
  LocalSequence one(engine, ctx, 16);
  const std::vector<float> lg = one.eval(toks.data(), ctx, true, ctx);  // [ctx, nv]: one forward
  for (int j = ctx / 2; j < ctx - 1; ++j, ++scored) nll += token_nll(&lg[size_t(j) * nv], nv, toks[size_t(j) + 1]);
  const std::vector<int> t(toks.begin(), toks.end());
  const PerplexityResult r = perplexity(engine, t, ctx, -1);
  EXPECT_EQ(r.n_scored, scored);
  EXPECT_EQ(r.nll, nll / double(scored));
  // kv_eval: the f32 cache against itself, and an int8 cache against f32,
  // each side equal to perplexity() with that cache.
  const KvEvalResult same = kv_eval(engine, t, ctx, -1, {});
  EXPECT_EQ(same.ppl, r.ppl);
  EXPECT_EQ(same.ppl_ref, r.ppl);
  KvEvalOptions o;
  o.cache.type = KvType::Int8;
  const KvEvalResult q = kv_eval(engine, t, ctx, -1, o);
  EXPECT_EQ(q.ppl_ref, r.ppl);
  EXPECT_EQ(q.ppl, perplexity(engine, t, ctx, -1, nullptr, o.cache).ppl);
  EXPECT_GT(q.kl, 0.0);
  EXPECT_EQ(q.n_scored, scored);
}
