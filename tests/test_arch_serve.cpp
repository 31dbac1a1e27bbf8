// `kvserve serve` runs every new architecture, the MoE ones included: a small
// model of each, made
// here, answers /v1/completions and /v1/chat/completions (the plain fallback
// template; for Gemma, Gemma 2's own Jinja template, which refuses system
// messages from a client by name; for gpt-oss, OpenAI's harmony template,
// whose rendering /apply-template shows), and the same greedy prompt gives the same
// text through the server as through `kvserve generate`, and the same chat
// turn the same reply through the server as through `kvserve chat`.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "http_client.h"
#include "kernels/cpu.h"
#include "kvs_process.h"
#include "test_util.h"
#include "tools/make_model.h"

using namespace kvs;
using nlohmann::json;

namespace {

std::string make(const std::string &arch, int layers, int window) {
  MakeModelOptions o;
  o.out = test::temp_dir() + "/serve-" + arch + ".gguf";
  // "llama-moe": a Mixtral-style llama (ffn_gate_inp present).
  o.arch = arch == "llama-moe" ? "llama" : arch;
  if (arch.find("moe") != std::string::npos) {
    o.n_expert = 4;
    o.n_expert_used = 2;
  }
  o.dim = 64;
  o.n_layers = layers;
  o.n_ctx = 256;
  o.window = window;
  o.progress = false;
  o.vocab_from = test::shared("golden/tokenizer/ggml-vocab-llama-spm.gguf");
  if (arch == "gpt-oss") { // byte-level BPE under gpt-oss's o200k pre-tokenizer
    o.vocab_from = test::shared("golden/tokenizer/ggml-vocab-gpt-2.gguf");
    o.tokenizer_pre = "gpt-4o";
  }
  make_random_model(o);
  return o.out;
}

class ArchServe : public ::testing::TestWithParam<const char *> {};

TEST_P(ArchServe, CompletionsAndChat) {
  if (!test::shared_available())
    GTEST_SKIP() << "../shared is not available";
  const std::string arch = GetParam();
  const bool gemma = arch.rfind("gemma", 0) == 0;
  const bool moe = arch.find("moe") != std::string::npos || arch == "llama-moe";
  const int window = arch == "qwen3" || moe ? -1 : 16;
  const std::string model = make(arch, arch == "gemma3" ? 6 : 2, window);
  std::vector<std::string> args = {"-m", model, "--ctx", "256", "-t", "2"};
  // The family's own template where the made file has none.
  std::string tmpl;
  if (gemma)
    tmpl = test::shared("chat-templates/google-gemma-2-2b-it.jinja");
  if (arch == "gpt-oss")
    tmpl = test::shared("chat-templates/openai-gpt-oss-120b.jinja");
  if (!tmpl.empty())
    args.insert(args.end(), {"--chat-template", tmpl});
  test::ServeProcess srv(args);

  const json req{
      {"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}};
  const test::HttpReply r =
      test::http_request(srv.port(), "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string text = json::parse(r.body)["choices"][0]["text"];
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"generate", "-m", model, "-p",
                               "Once upon a time", "-n", "12", "--temp", "0",
                               "--ctx", "256", "-t", "2", "--json"},
                              &out, &err),
            0)
      << err;
  EXPECT_EQ(text, json::parse(out)["text"].get<std::string>())
      << "server and generate disagree";

  const json chat{
      {"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
      {"max_tokens", 6},
      {"temperature", 0}};
  const test::HttpReply c = test::http_request(
      srv.port(), "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(json::parse(c.body)["choices"][0]["finish_reason"], "length")
      << c.body;
  if (arch == "gpt-oss") { // harmony: system header, the user turn, then the
                           // assistant's start
    const test::HttpReply t =
        test::http_request(srv.port(), "POST", "/apply-template", chat.dump());
    ASSERT_EQ(t.status, 200) << t.body;
    const std::string prompt = json::parse(t.body)["prompt"];
    EXPECT_EQ(prompt.rfind("<|start|>system<|message|>You are ChatGPT", 0), 0u)
        << prompt;
    EXPECT_NE(prompt.find("<|start|>user<|message|>Hello there<|end|><|start|>"
                          "assistant"),
              std::string::npos)
        << prompt;
  }

  // `kvserve chat` (stdin not a terminal) answers the same turn with the
  // same text as the server's chat endpoint.
  std::vector<std::string> chat_args = {
      "chat", "-m", model,    "--system", "",
      "-n",   "6",  "--temp", "0",        "--repeat-penalty",
      "1",    "-t", "2"};
  if (!tmpl.empty())
    chat_args.insert(chat_args.end(), {"--chat-template", tmpl});
  ASSERT_EQ(test::run_kvserve_input(chat_args, "Hello there\n", &out, &err), 0)
      << err;
  const std::string reply =
      json::parse(c.body)["choices"][0]["message"]["content"];
  ASSERT_FALSE(reply.empty());
  EXPECT_NE(out.find(reply), std::string::npos)
      << "chat printed:\n"
      << out << "\nserver answered: " << reply;
  if (gemma) {
    const json sys{{"messages",
                    {{{"role", "system"}, {"content", "Be brief."}},
                     {{"role", "user"}, {"content", "Hi"}}}},
                   {"max_tokens", 4}};
    const test::HttpReply e = test::http_request(
        srv.port(), "POST", "/v1/chat/completions", sys.dump());
    EXPECT_EQ(e.status, 400) << e.body;
    EXPECT_NE(e.body.find("System role not supported"), std::string::npos)
        << e.body;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ArchServe,
                         ::testing::Values("qwen3", "gemma2", "gemma3", "phi3",
                                           "qwen2moe", "qwen3moe", "llama-moe",
                                           "gpt-oss"),
                         [](const auto &i) {
                           std::string n = i.param;
                           for (char &c : n)
                             c = c == '-' ? '_' : c;
                           return n;
                         });

} // namespace

namespace {

// /health names how float-weight products and attention run; a bf16 server has its own
// model identity and answers as `kvserve generate --prefill-precision bf16`.
TEST(ServePrecision, HealthNamesItAndBf16MatchesGenerate) {
  if (!test::shared_available()) GTEST_SKIP() << "../shared is not available";
  const std::string model = test::shared("models/stories260K/stories260K.gguf");
  std::string fp32_identity;
  {
    test::ServeProcess srv({"-m", model, "-t", "2"});
    const test::HttpReply h = test::http_request(srv.port(), "GET", "/health");
    ASSERT_EQ(h.status, 200) << h.body;
    EXPECT_EQ(json::parse(h.body)["matmul_precision"], "fp32") << h.body;
    fp32_identity = json::parse(h.body)["model_identity"];
  }
  if (!amx_bf16_active()) GTEST_SKIP() << "no AMX-BF16 here: a bf16 server is refused (test_cli checks that)";
  test::ServeProcess srv({"-m", model, "-t", "2", "--prefill-precision", "bf16"});
  const test::HttpReply h = test::http_request(srv.port(), "GET", "/health");
  ASSERT_EQ(h.status, 200) << h.body;
  EXPECT_EQ(json::parse(h.body)["matmul_precision"], "bf16") << h.body;
  // stories260K's heads are 8 wide: its attention keeps the fp32 kernels.
  EXPECT_EQ(json::parse(h.body)["attention_precision"], "fp32") << h.body;
  EXPECT_NE(json::parse(h.body)["model_identity"], fp32_identity);
  const json req{{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}};
  const test::HttpReply r = test::http_request(srv.port(), "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"generate", "-m", model, "-p", "Once upon a time", "-n", "24", "--temp", "0", "-t", "2",
                               "--prefill-precision", "bf16", "--json"},
                              &out, &err),
            0)
      << err;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>(), json::parse(out)["text"].get<std::string>());
}

}  // namespace
