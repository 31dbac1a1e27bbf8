// The kvserve binary as users and CI call it: generate --json reproduces the
// goldens, perplexity matches llama.cpp, bad files and arguments give a clear
// error and a non-zero exit (never a crash).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu.h"
#include "test_util.h"

using namespace kvs;
using nlohmann::json;

namespace {

TEST(Cli, GenerateJsonReproducesGolden) {
  json g = json::parse(test::read_file(test::shared("golden/stories260K/once.json")));
  const int n = g["steps"].get<int>() - int(g["prompt_tokens"].size()) + 1;
  for (const char* m : {"stories260K.gguf", "stories260K.bin"}) {
    std::string out, err;
    int rc = test::run_kvserve({"generate", "-m", test::shared(std::string("models/stories260K/") + m), "-p",
                                g["prompt"].get<std::string>(), "-n", std::to_string(n), "--temp", "0", "--json"},
                               &out, &err);
    ASSERT_EQ(rc, 0) << err;
    json r = json::parse(out);
    EXPECT_EQ(r["prompt_tokens"], g["prompt_tokens"]) << m;
    EXPECT_EQ(r["tokens"], g["generated"]) << m;
    EXPECT_GT(r["decode_tokens_per_s"].get<double>(), 0);
    EXPECT_EQ(r["text"].get<std::string>().rfind(", there was a little girl named Lily.", 0), 0u) << r["text"];
  }
}

TEST(Cli, PerplexityMatchesLlamaCpp) {
  std::string out, err;
  int rc = test::run_kvserve({"perplexity", "-m", test::shared("models/stories260K/stories260K.gguf"), "-f",
                              test::shared("eval/stories-eval.txt"), "-c", "512", "--json"},
                             &out, &err);
  ASSERT_EQ(rc, 0) << err;
  json r = json::parse(out);
  EXPECT_NEAR(r["ppl"].get<double>(), 4.882, 0.005);
  EXPECT_NE(err.find("[1/"), std::string::npos) << "progress on stderr";
}

TEST(Cli, TokenizeIncludesBos) {
  std::string out, err;
  ASSERT_EQ(0, test::run_kvserve({"tokenize", "-m", test::shared("models/stories260K/stories260K.gguf"), "-p",
                                  "Once upon a time", "--json"},
                                 &out, &err))
      << err;
  json r = json::parse(out);
  EXPECT_EQ(r["tokens"], json::array({1, 403, 407, 261, 378}));
}

TEST(Cli, BadInputsFailCleanly) {
  const std::string dir = test::temp_dir();
  // A truncated copy of a real model, and a file of garbage.
  std::string model = test::read_file(test::shared("models/stories260K/stories260K.gguf"));
  std::ofstream(dir + "/trunc.gguf", std::ios::binary).write(model.data(), model.size() / 2);
  std::ofstream(dir + "/garbage.gguf", std::ios::binary) << "this is not a model at all";
  struct Case {
    std::vector<std::string> args;
    std::string expect_in_stderr;
  };
  std::vector<Case> cases = {
      {{"generate", "-m", dir + "/missing.gguf", "-p", "x"}, "missing.gguf"},
      {{"generate", "-m", dir, "-p", "x"}, "is a directory"},
      {{"generate", "-m", dir + "/trunc.gguf", "-p", "x"}, "trunc.gguf"},
      {{"generate", "-m", dir + "/garbage.gguf", "-p", "x"}, "garbage.gguf"},
      {{"generate", "-m", test::shared("models/stories260K/stories260K.gguf"), "-n", "-5"}, "-n"},
      {{"generate", "--no-such-flag"}, "no-such-flag"},
      {{"perplexity", "-m", test::shared("models/stories260K/stories260K.gguf"), "-f", dir + "/none.txt"}, "none.txt"},
      {{"generate", "-m", test::shared("models/stories260K/stories260K.gguf"), "-p", "x", "-c", "2", "-n", "5"}, "context"},
      {{"eval", "-m", test::shared("models/stories260K/stories260K.gguf"), "-f", test::shared("eval/stories-eval.txt"),
        "--kv-type", "int3"},
       "int3"},
      {{"eval", "-m", test::shared("models/stories260K/stories260K.gguf"), "-f", test::shared("eval/stories-eval.txt"),
        "--kv-type", "int4", "--kv-residual", "5"},
       "--kv-residual"},
      {{"eval", "-m", test::shared("models/stories260K/stories260K.gguf"), "-f", test::shared("eval/stories-eval.txt"),
        "--kv-sinks", "4"},
       "--kv-window"},
      {{"batched-bench", "-m", test::shared("models/stories260K/stories260K.gguf"), "--kv-type", "f17"}, "f17"},
  };
  for (const auto& c : cases) {
    std::string out, err;
    int rc = test::run_kvserve(c.args, &out, &err);
    EXPECT_NE(rc, 0) << c.args[0] << " " << c.expect_in_stderr;
    EXPECT_LT(rc, 128) << "killed by a signal: " << err;
    EXPECT_NE(err.find(c.expect_in_stderr), std::string::npos) << "stderr: " << err;
  }
}

// kvserve eval: the JSON fields the issue names, f32 equal to perplexity's
// 4.882, int8 within 0.5%, and a streaming run writes its SVG.
TEST(Cli, EvalReportsPplKlAndBytes) {
  const std::string m = test::shared("models/stories260K/stories260K.gguf"), f = test::shared("eval/stories-eval.txt");
  std::string out, err;
  ASSERT_EQ(0, test::run_kvserve({"eval", "-m", m, "-f", f, "--json"}, &out, &err)) << err;
  json r = json::parse(out);
  EXPECT_NEAR(r["ppl"].get<double>(), 4.882, 0.005);
  EXPECT_EQ(r["kl"].get<double>(), 0.0);
  EXPECT_EQ(r["kv_bytes_per_token"].get<double>(), 1280.0);  // 2 x 5 layers x 32 x 4 B
  ASSERT_EQ(0, test::run_kvserve({"eval", "-m", m, "-f", f, "--kv-type", "int8", "--json"}, &out, &err)) << err;
  r = json::parse(out);
  EXPECT_LT(std::abs(r["ppl"].get<double>() / r["ppl_f32"].get<double>() - 1), 0.005);
  EXPECT_GT(r["kl"].get<double>(), 0.0);
  EXPECT_LT(r["kl"].get<double>(), 0.001);
  EXPECT_LT(r["kv_bytes_per_token"].get<double>(), 400.0);
  const std::string svg = test::temp_dir() + "/stream.svg";
  ASSERT_EQ(0, test::run_kvserve({"eval", "-m", m, "-f", f, "--stream", "--kv-window", "64", "--kv-sinks", "4",
                                  "--segment", "500", "--svg", svg, "--json"},
                                 &out, &err))
      << err;
  r = json::parse(out);
  EXPECT_EQ(r["segment_ppl"].size(), 5u);  // 2,204 scored tokens in segments of 500
  EXPECT_LT(r["ppl"].get<double>(), 8.0);
  EXPECT_NE(test::read_file(svg).find("<svg"), std::string::npos);
  EXPECT_NE(err.find("running PPL"), std::string::npos) << "progress on stderr";
}

// --prefill-precision: a bad value and a CPU (or KVS_ISA) without AMX-BF16
// are refused before any work, naming what to do; where the tiles run, bf16
// is reported, eval measures it against fp32 products, and it costs
// stories260K almost nothing in perplexity.
TEST(Cli, PrefillPrecisionIsCheckedAndReported) {
  const std::string m = test::shared("models/stories260K/stories260K.gguf"), f = test::shared("eval/stories-eval.txt");
  std::string out, err;
  int rc = test::run_kvserve({"eval", "-m", m, "-f", f, "--prefill-precision", "fp16"}, &out, &err);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("fp16"), std::string::npos) << err;
  setenv("KVS_ISA", "avx512", 1);
  rc = test::run_kvserve({"eval", "-m", m, "-f", f, "--prefill-precision", "bf16"}, &out, &err);
  unsetenv("KVS_ISA");
  EXPECT_NE(rc, 0);
  EXPECT_LT(rc, 128) << err;
  EXPECT_NE(err.find("amx_bf16"), std::string::npos) << err;
  ASSERT_EQ(0, test::run_kvserve({"eval", "-m", m, "-f", f, "--json"}, &out, &err)) << err;
  const json fp32 = json::parse(out);
  EXPECT_EQ(fp32["precision"], "fp32");
  if (!amx_bf16_active()) GTEST_SKIP() << "no AMX-BF16 here: the bf16 run itself is not checked";
  ASSERT_EQ(0, test::run_kvserve({"eval", "-m", m, "-f", f, "--json", "--prefill-precision", "bf16"}, &out, &err)) << err;
  const json bf16 = json::parse(out);
  EXPECT_EQ(bf16["precision"], "bf16");
  EXPECT_NE(bf16["ppl"].get<double>(), fp32["ppl"].get<double>()) << "bf16 changed nothing: did it run?";
  EXPECT_LT(std::abs(bf16["ppl"].get<double>() / fp32["ppl"].get<double>() - 1), 0.005);
  // Measured against fp32 products: the reference is the fp32 run itself.
  EXPECT_EQ(bf16["reference"], "fp32 products, f32 cache");
  EXPECT_EQ(bf16["ppl_f32"].get<double>(), fp32["ppl"].get<double>());
  EXPECT_GT(bf16["kl"].get<double>(), 0.0);
  EXPECT_LT(bf16["kl"].get<double>(), 0.001);
}

// generate past the 512-token training context: with a window it runs on
// (int8 cache, 4 sinks + 128), without one it stops when the context is full.
TEST(Cli, GenerateRunsPastTheContextWithAWindow) {
  const std::string m = test::shared("models/stories260K/stories260K.gguf");
  std::string out, err;
  ASSERT_EQ(0, test::run_kvserve({"generate", "-m", m, "-n", "1500", "--temp", "0", "--ignore-eos", "--kv-type", "int8",
                                  "--kv-window", "128", "--kv-sinks", "4", "--json"},
                                 &out, &err))
      << err;
  EXPECT_EQ(json::parse(out)["tokens"].size(), 1500u);
  ASSERT_EQ(0, test::run_kvserve({"generate", "-m", m, "-n", "1500", "--temp", "0", "--ignore-eos", "--json"}, &out, &err))
      << err;
  const json r = json::parse(out);
  EXPECT_LT(r["tokens"].size(), 512u);
  EXPECT_EQ(r["finish_reason"], "length");
}

// batched-bench takes the KV options of bench (llama-batched-bench's cache is
// f16, so like-for-like runs need them) and says which type it ran.
TEST(Cli, BatchedBenchTakesTheKvType) {
  const std::string m = test::shared("models/stories260K/stories260K.gguf");
  for (const char* t : {"f16", "int8"}) {
    std::string out, err;
    ASSERT_EQ(0, test::run_kvserve({"batched-bench", "-m", m, "-p", "16", "-n", "4", "--npl", "1,4", "--kv-type", t, "--json"},
                                   &out, &err))
        << err;
    const auto j = nlohmann::json::parse(out.substr(out.find('{')));
    EXPECT_EQ(j["kv_type"], t);
    ASSERT_EQ(j["rows"].size(), 2u);
    for (const auto& r : j["rows"]) EXPECT_GT(double(r["s_tg"]), 0.0);
  }
}

TEST(Cli, HelpOnEveryCommand) {
  for (const char* cmd : {"generate", "tokenize", "perplexity", "eval", "bench", "make-model", "convert", "plan", "probe",
                          "serve", "batched-bench", "kv-sim", "kv-bench"}) {
    std::string out, err;
    EXPECT_EQ(0, test::run_kvserve({cmd, "--help"}, &out, &err)) << cmd;
    EXPECT_NE(out.find("Usage"), std::string::npos) << cmd << ": " << out;
  }
}

}  // namespace

namespace {

// A fresh machine has no ../shared: kvserve must still start, on a random
// model it writes itself, and say so.
TEST(Cli, DefaultModelWithoutSharedIsGeneratedAndAnnounced) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(test::temp_dir()) / "fresh";
  fs::create_directories(root / "a" / "b");
  const fs::path exe = root / "a" / "b" / "kvserve";
  fs::copy_file(KVS_BINARY, exe, fs::copy_options::overwrite_existing);
  const std::string cmd = "cd '" + root.string() + "/a' && env -u KVSERVE_SHARED XDG_CACHE_HOME='" + root.string() +
                          "/cache' '" + exe.string() + "' generate -p hello -n 4 --temp 0 --ignore-eos --json 2>'" + root.string() +
                          "/err.txt'";
  for (int run = 0; run < 2; ++run) {  // second run reuses the written model
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ASSERT_EQ(pclose(p), 0) << test::read_file((root / "err.txt").string());
    const std::string err = test::read_file((root / "err.txt").string());
    EXPECT_NE(err.find("RANDOM-WEIGHT"), std::string::npos) << err;
    json r = json::parse(out);
    EXPECT_EQ(r["tokens"].size(), 4u);
    EXPECT_NE(r["model"].get<std::string>().find(root.string() + "/cache/kvserve/"), std::string::npos);
  }
}

}  // namespace
