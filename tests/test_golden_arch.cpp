// Every architecture against its peer (tests/data/arch_goldens.json, written
// by scripts/arch-goldens.py from llama.cpp b4748 where it has the
// architecture, else ik_llama.cpp): a tiny random model made here by
// `kvserve make-model` with the stored arguments must be the very file the
// peer ran (sha256: make-model is deterministic), kvserve's perplexity on
// ../shared/eval/stories-eval.txt at ctx 256 must be the peer's within the
// tolerance below, with f32 and with f16 KV, and its greedy tokens on three
// prompts the peer's wherever the peer's top-2 logit margin allows.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/perplexity.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvs;
using nlohmann::json;

namespace {

// F16 weights: kvserve against the peer, the bound (the measured
// gaps are in README's model table).
constexpr double kTolF16 = 0.0005;
// Q8_0 weights: quantized activations turn tiny differences into different
// rounding, so two correct engines differ more. The bound is what the two
// peers show between themselves on the llama and qwen2 Q8_0 files of the
// JSON (llama-q8_0, qwen2-linear-q8_0; PeersAgreeWithinTheQ8Tolerance checks
// the stored numbers still say so).
constexpr double kTolQ8 = 0.0012;
// Q8_0 weights of a mixture-of-experts model: a token's experts are picked
// by comparing router scores, and a near-tie goes the other way with the
// last bits of the activations, moving that token's output by a whole
// expert. The two peers differ by up to 0.34% between themselves on the
// Q8_0 qwen2moe files measured (the JSON's about); PeersAgreeWithinTheQ8Tolerance
// checks the stored qwen2moe-q8_0 pair against this bound.
constexpr double kTolQ8Moe = 0.004;
// gpt-oss: a mixture of experts whose experts are MXFP4 (as the real
// files), so both effects above meet: int8 activations that the two engines
// round differently (test_golden_peer's MXFP4 llama: 0.08%) and routing
// near-ties that go the other way. Only ik_llama.cpp has gpt-oss, so the
// bound is that peer's own spread, measured on six seeds of the JSON's
// shape (4 layers, 16 heads over 2 KV heads of 64, window 32, 8 experts top
// 4): with F16 non-expert weights its perplexity moves by up to 0.18%
// between its f16 and f32 K caches and by up to 0.13% with and without its
// flash attention (kvserve was within 0.15% of it on all six), hence 0.2%;
// with Q8_0 non-expert weights by up to 0.23% and 0.15% (kvserve within
// 0.30%), which the Q8_0 MoE bound above covers.
constexpr double kTolMxfp4Experts = 0.002;
// A greedy step may differ from the peer's only where the two best logits
// are closer than the engines' logit gap, F16 and quantized weights (the
// measured gaps: ../shared/golden/peer/README.md), with room to spare.
constexpr double kTieF16 = 0.01, kTieQ8 = 0.15;

const json& goldens() {
  static const json j = json::parse(test::read_file(std::string(KVS_SOURCE_DIR) + "/tests/data/arch_goldens.json"));
  return j;
}

std::string sha256_file(const std::string& path) {
  const std::string bytes = test::read_file(path);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) out += hex[md[i] >> 4], out += hex[md[i] & 15];
  return out;
}

// make-model with the stored arguments ("../shared/..." resolved here).
std::string make_model(const json& m) {
  const std::string out = test::temp_dir() + "/" + m["name"].get<std::string>() + ".gguf";
  std::vector<std::string> args = {"make-model", "-q", "-o", out};
  for (std::string a : m["make_model"]) {
    if (a.rfind("../shared/", 0) == 0) a = test::shared(a.substr(10));
    args.push_back(a);
  }
  std::string err;
  EXPECT_EQ(test::run_kvserve(args, nullptr, &err), 0) << err;
  return out;
}

class GoldenArch : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenArch, MatchesPeer) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared is not available";
  const json* mp = nullptr;
  for (const json& m : goldens()["models"])
    if (m["name"] == GetParam()) mp = &m;
  ASSERT_NE(mp, nullptr);
  const json& m = *mp;
  const json& peer = m["peers"][m["reference"].get<std::string>()];
  ASSERT_TRUE(peer.contains("ppl")) << "no peer numbers for " << GetParam() << " (run scripts/arch-goldens.py)";
  const std::string path = make_model(m);
  ASSERT_EQ(sha256_file(path), m["sha256"].get<std::string>()) << "make-model no longer writes the file the peer ran";

  const int ctx = goldens()["ctx"];
  const bool f16 = std::find(m["make_model"].begin(), m["make_model"].end(), "f16") != m["make_model"].end();
  const bool moe = std::find(m["make_model"].begin(), m["make_model"].end(), "--experts") != m["make_model"].end();
  // gpt-oss files carry MXFP4 experts (make-model's default for it).
  const auto arch = std::find(m["make_model"].begin(), m["make_model"].end(), "--arch");
  const bool mxfp4_experts = arch != m["make_model"].end() && *std::next(arch) == "gpt-oss";
  const double tol = mxfp4_experts ? (f16 ? kTolMxfp4Experts : kTolQ8Moe) : f16 ? kTolF16 : moe ? kTolQ8Moe : kTolQ8;
  const double tie = f16 && !mxfp4_experts ? kTieF16 : kTieQ8;
  auto model = Model::load(path);
  auto tok = Tokenizer::create(model->vocab());
  EngineOptions eo;
  eo.n_threads = 2;
  eo.n_ctx = ctx;  // as the peer's -c: LongRoPE picks its factors by it
  Engine engine(model, eo);
  const Vocab& v = model->vocab();
  const std::vector<int> text = tok->encode(test::read_file(test::shared(goldens()["eval"])), v.add_bos);
  for (KvType kvt : {KvType::F32, KvType::F16}) {
    SCOPED_TRACE(to_string(kvt));
    KvCacheOptions kv;
    kv.type = kvt;
    const PerplexityResult r = perplexity(engine, text, ctx, v.add_bos ? v.bos : -1, nullptr, kv);
    // The peer's numbers with an f32 cache where the JSON has them (MoE
    // models: a rounding of the cache can flip a routing near-tie), else its
    // default f16 cache's.
    const json& ref = kvt == KvType::F32 && peer.contains("f32_kv") ? peer["f32_kv"] : peer;
    const double want = ref["ppl"], rel = std::fabs(r.ppl - want) / want;
    std::printf("%s %s: PPL %.4f, peer %.4f, %.4f%%\n", GetParam().c_str(), to_string(kvt), r.ppl, want,
                100 * rel);
    EXPECT_LT(rel, tol);

    for (size_t i = 0; i < goldens()["prompts"].size(); ++i) {
      const json& g = ref["greedy"][i];
      const std::vector<int> prompt = tok->encode(goldens()["prompts"][i].get<std::string>(), v.add_bos);
      ASSERT_EQ(prompt, g["prompt_tokens"].get<std::vector<int>>()) << "prompt " << i;
      GenerateParams gp;
      gp.sampling.temperature = 0;
      gp.max_tokens = goldens()["n_predict"];
      gp.ignore_eos = true;
      gp.n_ctx = ctx;
      gp.cache = kv;
      const GenerateResult out = generate(engine, *tok, prompt, gp);
      const auto expect = g["tokens"].get<std::vector<int>>();
      // null: the peer's server gave no probabilities for that step (a byte token).
      std::vector<double> margin;
      for (const json& x : g["top2_margin"]) margin.push_back(x.is_null() ? -1.0 : x.get<double>());
      const size_t n = std::min(out.tokens.size(), expect.size());
      size_t same = 0;
      while (same < n && out.tokens[same] == expect[same]) ++same;
      std::printf("  prompt %zu: %zu of %zu greedy tokens as the peer's\n", i, same, expect.size());
      if (same == n && n < expect.size()) {
        // generate() ends at a generated BOS / EOS, where the peer (ignore_eos) went on: it must be the peer's too.
        EXPECT_TRUE(ends_generation(*tok, expect[n])) << "prompt " << i << ": kvserve stopped after " << n
                                                      << " tokens, the peer's next is " << expect[n];
        continue;
      }
      // Only a near-tie may go the other way; after it the texts differ legitimately.
      if (same < expect.size()) {
        EXPECT_GE(margin[same], 0.0) << "prompt " << i << " step " << same << ": the peer's margin is unknown";
        EXPECT_LT(margin[same], tie) << "prompt " << i << " step " << same << ": got "
                                                         << out.tokens[same] << ", peer " << expect[same];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, GoldenArch, ::testing::ValuesIn([] {
                           std::vector<std::string> names;
                           for (const json& m : goldens()["models"]) names.push_back(m["name"]);
                           return names;
                         }()),
                         [](const auto& i) {
                           std::string s = i.param;
                           for (char& c : s) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

// The Q8_0 bounds above are the peers' own spread: on llama / qwen2 files,
// and on a mixture-of-experts file.
TEST(GoldenArch, PeersAgreeWithinTheQ8Tolerance) {
  double worst = 0, worst_moe = 0;
  int n = 0;
  for (const json& m : goldens()["models"]) {
    const std::string name = m["name"];
    if (name != "llama-q8_0" && name != "qwen2-linear-q8_0" && name != "qwen2moe-q8_0") continue;
    const json& p = m["peers"];
    ASSERT_TRUE(p["llama.cpp"].contains("ppl") && p["ik_llama.cpp"].contains("ppl")) << name;
    const double a = p["llama.cpp"]["ppl"], b = p["ik_llama.cpp"]["ppl"];
    double& w = name == "qwen2moe-q8_0" ? worst_moe : worst;
    w = std::max(w, std::fabs(a - b) / a);
    ++n;
  }
  EXPECT_EQ(n, 3);
  std::printf("llama.cpp vs ik_llama.cpp on Q8_0 llama / qwen2: %.4f%%, qwen2moe: %.4f%%\n", 100 * worst,
              100 * worst_moe);
  EXPECT_LE(worst, kTolQ8);
  EXPECT_LE(worst_moe, kTolQ8Moe);
}

}  // namespace
