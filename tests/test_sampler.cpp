// Sampler: greedy, seeds reproduce, each filter cuts what it should, and the
// stop-string matcher holds back possible prefixes.
#include <gtest/gtest.h>

#include <map>

#include "engine/generate.h"
#include "engine/sampler.h"

using namespace kvs;

TEST(Sampler, GreedyPicksArgmaxLowestOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  float l[5] = {1, 3, 3, 2, -1};
  EXPECT_EQ(s.sample(l, 5, {}), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0, p.top_p = 1, p.min_p = 0;
  p.seed = 1234;
  float l[6] = {0.1f, 0.2f, 0.3f, 0.1f, 0.0f, 0.25f};
  Sampler a(p), b(p);
  std::vector<int> x, y;
  for (int i = 0; i < 200; ++i) x.push_back(a.sample(l, 6, {})), y.push_back(b.sample(l, 6, {}));
  EXPECT_EQ(x, y);
  std::map<int, int> seen;
  for (int t : x) seen[t]++;
  EXPECT_EQ(seen.size(), 6u);  // temperature 1, no filters: every token appears
}

TEST(Sampler, TopKTopPMinPCut) {
  float l[5] = {5, 4, 3, 0, -5};
  auto draw_set = [&](SamplingParams p) {
    p.seed = 9;
    Sampler s(p);
    std::map<int, int> seen;
    for (int i = 0; i < 2000; ++i) seen[s.sample(l, 5, {})]++;
    return seen;
  };
  SamplingParams p;
  p.temperature = 5.0f;  // flatten so every surviving candidate shows up
  p.top_k = 2, p.top_p = 1, p.min_p = 0;
  auto s1 = draw_set(p);
  EXPECT_EQ(s1.size(), 2u);
  EXPECT_TRUE(s1.count(0) && s1.count(1));
  p.top_k = 0, p.top_p = 0.5f;  // p(top1 at T=1) = 0.66 -> only token 0
  EXPECT_EQ(draw_set(p).size(), 1u);
  p.top_p = 1, p.min_p = 0.3f;  // p1/p0 = e^-1 = 0.37 keeps 1; p2/p0 = 0.135 drops 2
  auto s3 = draw_set(p);
  EXPECT_EQ(s3.size(), 2u);
}

TEST(Sampler, RepetitionPenaltyDemotesSeenTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  float l[3] = {2.0f, 1.5f, -1.0f};
  EXPECT_EQ(s.sample(l, 3, {0}), 1);  // 2.0/2 = 1.0 < 1.5
}

TEST(StopMatcher, HoldsPrefixesAndCutsAtStop) {
  StopMatcher m({"END", "\n\n"});
  bool stopped = false;
  EXPECT_EQ(m.push("hello E", stopped), "hello ");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.push("N", stopped), "");
  EXPECT_EQ(m.push("Dx", stopped), "");
  EXPECT_TRUE(stopped);
  StopMatcher m2({"END"});
  EXPECT_EQ(m2.push("aEN", stopped), "a");
  EXPECT_EQ(m2.push("x", stopped), "ENx");
  EXPECT_EQ(m2.push("EN", stopped), "");
  EXPECT_EQ(m2.flush(), "EN");
}

// logit_bias first, then OpenAI's presence / frequency penalties over the
// generated counts, then bans; each changes the argmax exactly as defined.
TEST(Sampler, LogitBiasPenaltiesAndBans) {
  float l[4] = {3.0f, 2.5f, 2.0f, 0.0f};
  SamplingParams p;
  p.temperature = 0;
  {
    p.logit_bias = {{0, -100.0f}};
    Sampler s(p);
    EXPECT_EQ(s.sample(l, 4, {}), 1);  // -100 removes token 0
    p.logit_bias = {{3, 3.5f}};
    Sampler t(p);
    EXPECT_EQ(t.sample(l, 4, {}), 3);  // 0 + 3.5 > 3
    p.logit_bias.clear();
  }
  const std::unordered_map<int32_t, int> counts = {{0, 2}, {1, 1}};
  DrawContext ctx;
  ctx.generated = &counts;
  p.frequency_penalty = 0.3f;  // token 0: 3 - 0.6 = 2.4, token 1: 2.5 - 0.3 = 2.2
  EXPECT_EQ(Sampler(p).sample_with(l, 4, ctx), 0);
  p.frequency_penalty = 0.6f;  // token 0: 1.8, token 1: 1.9, token 2: 2.0
  EXPECT_EQ(Sampler(p).sample_with(l, 4, ctx), 2);
  p.frequency_penalty = 0;
  p.presence_penalty = 0.75f;  // once per seen token: 2.25, 1.75, 2.0
  EXPECT_EQ(Sampler(p).sample_with(l, 4, ctx), 0);
  p.presence_penalty = 1.1f;  // 1.9, 1.4, 2.0
  EXPECT_EQ(Sampler(p).sample_with(l, 4, ctx), 2);
  DrawContext none;  // no counts given: no penalty
  EXPECT_EQ(Sampler(p).sample_with(l, 4, none), 0);
  const int32_t banned[] = {0, 2};
  ctx.banned = banned;
  EXPECT_EQ(Sampler(p).sample_with(l, 4, ctx), 1);  // 1.4 is all that is left above 0
  // Sampled at a temperature, a banned token is never drawn.
  p.temperature = 1.5f;
  p.top_k = 0, p.top_p = 1, p.min_p = 0, p.presence_penalty = 0;
  Sampler s(p);
  for (int i = 0; i < 500; ++i) {
    const int t = s.sample_with(l, 4, ctx);
    ASSERT_TRUE(t == 1 || t == 3) << t;
  }
}
