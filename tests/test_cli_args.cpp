// The kvserve command line refuses what it cannot honour, before any work
// and any output: bad lists and counts, a session folder that is a file, a
// key file that is not a key, options that would be silently ignored, shapes
// too big to write. Each case is a defect of the CLI audit (its number in
// the comment); each must give a clear error and a non-zero exit, never a
// crash, and must leave the user's files alone.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_util.h"

using namespace kvs;
namespace fs = std::filesystem;

namespace {

std::string model() { return test::shared("models/stories260K/stories260K.gguf"); }

struct Refusal {
  std::vector<std::string> args;
  std::string in_stderr;  // the option or item the error must name
};

// Each case exits non-zero (not by a signal), prints nothing on stdout, and
// names what is wrong on stderr.
void expect_refused(const std::vector<Refusal>& cases) {
  for (const auto& c : cases) {
    std::string out, err, line;
    for (const auto& a : c.args) line += a + " ";
    const int rc = test::run_kvserve(c.args, &out, &err);
    EXPECT_NE(rc, 0) << line;
    EXPECT_LT(rc, 128) << line << "killed by a signal: " << err;
    EXPECT_EQ(out, "") << line;
    EXPECT_NE(err.find(c.in_stderr), std::string::npos) << line << "\nstderr: " << err;
  }
}

// Audit 1: --npl is parsed and checked; no segfault, no bare "stoi".
TEST(CliArgs, BatchedBenchNplIsValidated) {
  for (const std::string bad : {"0", "0,1", "-1", "abc", "1,,2", "4,"}) {
    std::string out, err;
    const int rc =
        test::run_kvserve({"batched-bench", "-m", model(), "-t", "1", "-p", "8", "-n", "4", "--npl", bad}, &out, &err);
    EXPECT_EQ(rc, 1) << "--npl " << bad << ": " << err;
    EXPECT_NE(err.find("--npl"), std::string::npos) << err;
    EXPECT_EQ(err.find("stoi"), std::string::npos) << err;
  }
  std::string out, err;
  EXPECT_NE(test::run_kvserve({"batched-bench", "-m", model(), "--npl", "1,abc"}, &out, &err), 0);
  EXPECT_NE(err.find("'abc'"), std::string::npos) << "names the bad item: " << err;
}

// Audit 2: a file given as --session-dir, or a file that is no key as
// --key-file, is refused and left as it was.
TEST(CliArgs, WipeDeletesOnlyWhatIsOurs) {
  const std::string dir = test::temp_dir() + "/wipe";
  fs::create_directories(dir);
  const std::string precious = dir + "/precious.txt";
  std::ofstream(precious) << "precious data\n";
  std::string out, err;
  EXPECT_EQ(test::run_kvserve({"wipe", "--session-dir", precious}, &out, &err), 1);
  EXPECT_NE(err.find("not a directory"), std::string::npos) << err;
  ASSERT_TRUE(fs::exists(precious));
  EXPECT_EQ(test::read_file(precious), "precious data\n");

  const std::string sessions = dir + "/sessions";
  fs::create_directories(sessions);
  EXPECT_EQ(test::run_kvserve({"wipe", "--session-dir", sessions, "--key-file", precious}, &out, &err), 1);
  EXPECT_NE(err.find("not a kvserve session key"), std::string::npos) << err;
  EXPECT_EQ(test::read_file(precious), "precious data\n");
  EXPECT_TRUE(fs::exists(sessions)) << "nothing deleted";

  // A real key (as load_or_create_key_file writes it) is still shredded.
  const std::string key = dir + "/session.key";
  std::ofstream(key) << std::string(64, 'a') << "\n";
  ::chmod(key.c_str(), 0600);
  ASSERT_EQ(test::run_kvserve({"wipe", "--session-dir", sessions, "--key-file", key}, &out, &err), 0) << err;
  EXPECT_NE(out.find("wiped 1 files"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(key));
  EXPECT_FALSE(fs::exists(sessions)) << "the empty folder goes too";

  // Audit 9 M7: with another --key-file, the folder's own session key (the
  // one its sessions were sealed with) is shredded too.
  fs::create_directories(sessions);
  const std::string own = sessions + "/session.key";
  std::ofstream(own) << std::string(64, 'b') << "\n";
  std::ofstream(key) << std::string(64, 'a') << "\n";
  ::chmod(own.c_str(), 0600);
  ::chmod(key.c_str(), 0600);
  ASSERT_EQ(test::run_kvserve({"wipe", "--session-dir", sessions, "--key-file", key}, &out, &err), 0) << err;
  EXPECT_FALSE(fs::exists(own)) << "the folder's own key survived: " << out;
}

// Audit 5: progress in a log (stderr not a terminal) has no carriage returns.
TEST(CliArgs, BenchProgressOnlyOnATerminal) {
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"bench", "-m", model(), "-t", "1", "-p", "16", "-n", "4", "-r", "2"}, &out, &err), 0)
      << err;
  EXPECT_EQ(err.find('\r'), std::string::npos) << err;
  ASSERT_EQ(test::run_kvserve({"kv-bench", "-m", model(), "-t", "1", "-p", "16", "-n", "4", "--system-tokens", "32",
                               "--user-tokens", "8", "-r", "2"},
                              &out, &err),
            0)
      << err;
  EXPECT_EQ(err.find('\r'), std::string::npos) << err;
}

// Audit 7: negative counts are option errors; -n 0 alone still skips decode.
TEST(CliArgs, BenchCountsAreChecked) {
  expect_refused({
      {{"bench", "-m", model(), "-t", "1", "-p", "-5", "-n", "4", "-r", "1"}, "-p"},
      {{"bench", "-m", model(), "-t", "1", "-p", "16", "-n", "-1", "-r", "1"}, "-n"},
      {{"bench", "-m", model(), "-t", "1", "-p", "0", "-n", "0", "-r", "1"}, "nothing to measure"},
  });
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"bench", "-m", model(), "-t", "1", "-p", "16", "-n", "0", "-r", "1"}, &out, &err), 0)
      << err;
  EXPECT_NE(out.find("pp16"), std::string::npos) << out;
  EXPECT_EQ(out.find("tg"), std::string::npos) << out;
}

// Audit 16: a word where a number belongs is "not a number", and an open
// bound is said as a bound (CLI11 prints the largest double in full).
TEST(CliArgs, NumberErrorsReadAsWords) {
  expect_refused({
      {{"generate", "-m", model(), "-n", "abc"}, "--n-predict: 'abc' is not a number"},
      {{"generate", "-m", model(), "--top-p", "2"}, "--top-p: 2 is out of range: it must be between 0 and 1"},
      {{"probe", "--threads", "-1"}, "--threads: -1 is out of range: it must be at least 0"},
      {{"make-model", "--head-dim", "0", "-o", "/tmp/never.gguf"}, "--head-dim: 0 is out of range: it must be greater than 0"},
  });
  const std::string not_json = test::temp_dir() + "/profile.txt";
  std::ofstream(not_json) << "hello\n";
  expect_refused({{{"plan", "-m", model(), "--profile", not_json}, "is not a hardware profile: not JSON"}});
  std::string out, err;
  EXPECT_NE(test::run_kvserve({"probe", "--threads", "-1"}, &out, &err), 0);
  EXPECT_EQ(err.find("1797693"), std::string::npos) << err;
  EXPECT_NE(err.find("--help"), std::string::npos) << "still points at --help: " << err;
}

// Audit 9 D11: a quantized type the rows cannot take is said, even quietly.
TEST(CliArgs, MakeModelSaysWhatStaysF16) {
  const std::string out_path = test::temp_dir() + "/mk.gguf";
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"make-model", "-q", "--type", "q4_k", "-o", out_path}, &out, &err), 0) << err;
  EXPECT_NE(err.find("are stored as F16"), std::string::npos) << err;
  ASSERT_EQ(test::run_kvserve({"make-model", "-q", "--type", "q8_0", "-o", out_path}, &out, &err), 0) << err;
  EXPECT_EQ(err.find("F16"), std::string::npos) << "rows fill q8_0 blocks: " << err;
}

// Audit 6: an absurd shape is refused from its size estimate, at once and
// without allocating (the run is capped at 2 GiB of address space and 60 s,
// so a regression fails instead of eating the machine).
TEST(CliArgs, MakeModelRefusesAnAbsurdShape) {
  const std::string out_path = test::temp_dir() + "/absurd.gguf", errf = test::temp_dir() + "/absurd.err";
  const std::string cmd = "ulimit -v 2097152; timeout 60 '" + std::string(KVS_BINARY) + "' make-model -o '" + out_path +
                          "' --dim 100000000 --layers 1000 2>'" + errf + "' >/dev/null";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1) << test::read_file(errf);
  EXPECT_NE(test::read_file(errf).find("iB"), std::string::npos) << test::read_file(errf);
  EXPECT_FALSE(fs::exists(out_path));
  // A sane shape is still written.
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"make-model", "-o", test::temp_dir() + "/tiny.gguf", "-q"}, &out, &err), 0) << err;
}

// Audits 8, 9, 10, 12, 14: refused up front, with nothing on stdout.
TEST(CliArgs, RefusedBeforeAnyOutput) {
  const std::string dir = test::temp_dir();
  std::string long_prompt = test::read_file(test::shared("eval/stories-eval.txt")).substr(0, 1500);
  expect_refused({
      {{"plan", "--preset", "llama-3-8b", "--mem", "0"}, "--mem"},
      {{"plan", "--preset", "llama-3-8b", "--prompt", "9000", "--ctx", "4096"}, "--prompt"},
      {{"plan", "--preset", "llama-3-8b", "--prompt", "4000", "--max-tokens", "200", "--ctx", "4096"}, "--max-tokens"},
      {{"perplexity", "-m", model(), "-t", "1", "-f", dir}, "directory"},
      {{"eval", "-m", model(), "-t", "1", "-f", dir}, "directory"},
      {{"tokenize", "-m", model(), "-f", dir}, "directory"},
      {{"generate", "-m", model(), "-t", "1", "-n", "4", "-c", "64", "-p", long_prompt}, "raise --ctx"},
      {{"generate", "-m", model(), "-t", "1", "-n", "4", "--kv-type", "int8", "--kv-residual", "7"}, "--kv-residual"},
      {{"nosuch"}, "nosuch"},
  });
}

// Audit 11: options that would be silently ignored are refused, naming the
// option they need or the one that is wrong.
TEST(CliArgs, IgnoredOptionsAreRefused) {
  const std::string f = test::shared("eval/stories-eval.txt"), svg = test::temp_dir() + "/x.svg";
  expect_refused({
      {{"eval", "-m", model(), "-f", f, "-c", "128", "--svg", svg}, "--stream"},
      {{"eval", "-m", model(), "-f", f, "--stream", "--compare", "--kv-window", "32"}, "--compare"},
      {{"generate", "-m", model(), "-n", "2", "--kv-text-positions"}, "--kv-window"},
      {{"generate", "-m", model(), "-n", "2", "--kv-type", "f32", "--kv-residual", "8"}, "--kv-residual"},
      {{"generate", "-m", model(), "-n", "2", "--kv-key-scale", "token"}, "--kv-key-scale"},
      {{"generate", "-m", model(), "-n", "2", "--tokenizer", "/nonexistent"}, "--tokenizer"},
      {{"bench", "-m", model(), "--svg-depths", "0,32"}, "--svg"},
      {{"batched-bench", "-m", model(), "--max-batch-tokens", "0"}, "--max-batch-tokens"},
      {{"batched-bench", "-m", model(), "--max-batch-tokens", "-5"}, "--max-batch-tokens"},
      {{"batched-bench", "-m", model(), "--burst", "-3"}, "--burst"},
      {{"batched-bench", "-m", model(), "--temp", "-1"}, "--temp"},
      {{"batched-bench", "-m", model(), "--burst", "4", "--burst-fit", "0"}, "--burst-fit"},
      {{"make-model", "-o", test::temp_dir() + "/moe.gguf", "--arch", "qwen2moe", "--experts", "0"}, "--experts"},
      // Audit 14: where probe saves is checked before it measures.
      {{"probe", "-o", test::temp_dir(), "--size", "1MiB", "--kernels", "none"}, "is a directory"},
      // serve's --ram-budget chooses the KV format: a given one would be replaced.
      {{"serve", "-m", model(), "--ram-budget", "64MiB", "--kv-type", "f16"}, "--kv-type"},
      {{"serve", "-m", model(), "--ram-budget", "64MiB", "--kv-type", "int8", "--kv-group", "32"}, "--kv-"},
  });
  EXPECT_FALSE(fs::exists(svg));
  std::string out, err;
  setenv("KVS_ISA", "bogus", 1);
  const int rc = test::run_kvserve({"tokenize", "-m", model(), "-p", "hi"}, &out, &err);
  unsetenv("KVS_ISA");
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("KVS_ISA=bogus"), std::string::npos) << err;
}

}  // namespace

namespace {

// Audit 13: a context past the model's trained one runs, with a warning
// that says so (stories260K was trained at 512 tokens).
TEST(CliArgs, ContextPastTheTrainedOneIsWarnedAbout) {
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"generate", "-m", model(), "-t", "1", "-n", "2", "-c", "1024", "-p", "Once"}, &out, &err), 0)
      << err;
  EXPECT_NE(err.find("beyond the model's trained context of 512"), std::string::npos) << err;
  ASSERT_EQ(test::run_kvserve({"generate", "-m", model(), "-t", "1", "-n", "2", "-c", "512", "-p", "Once"}, &out, &err), 0)
      << err;
  EXPECT_EQ(err.find("trained context"), std::string::npos) << err;
}

}  // namespace

// Audit 9 H3: chat on the default model with no options starts (the default
// -n gives way to the model's small window, said in a note); a given -n that
// cannot fit is refused naming both numbers and what to pass.
TEST(CliArgs, ChatDefaultsFitASmallModel) {
  const std::string dir = test::temp_dir() + "/chat-defaults";
  std::string out, err;
  ASSERT_EQ(test::run_kvserve_input({"chat", "-m", model(), "-t", "1", "--session-dir", dir}, "hi\n/quit\n", &out, &err), 0)
      << err;
  EXPECT_NE(err.find("at most 255 tokens per reply"), std::string::npos) << err;
  // Audit 9 H5: a resumed session's KV format is kept, and said so.
  ASSERT_EQ(test::run_kvserve_input({"chat", "-m", model(), "-t", "1", "--session-dir", dir}, "hi\n/save s1\n/quit\n",
                                    &out, &err),
            0)
      << err;
  ASSERT_EQ(test::run_kvserve_input({"chat", "-m", model(), "-t", "1", "--session-dir", dir, "--resume", "s1",
                                     "--kv-type", "int8"},
                                    "/quit\n", &out, &err),
            0)
      << err;
  EXPECT_NE(err.find("keeps the KV format it was saved with (f32)"), std::string::npos) << err;
  expect_refused({{{"chat", "-m", model(), "-t", "1", "--session-dir", dir, "-n", "300"},
                   "-n 300 must be below the window of 256 tokens"}});
  expect_refused({{{"generate", "-m", model(), "--repeat-penalty", "0"}, "--repeat-penalty"},
                  {{"generate", "-m", model(), "--top-k", "-5"}, "--top-k"},
                  {{"generate", "-m", model(), "--temp", "nan"}, "--temp: 'nan' is not a finite number"},
                  {{"serve", "-m", model(), "--kv-retention", "nan"}, "--kv-retention: 'nan' is not a finite number"}});
}

// Audit 9 H6: a tier that could never store anything is refused at start.
TEST(CliArgs, AnInertTierIsRefused) {
  const std::string dir = test::temp_dir() + "/inert";
  fs::create_directories(dir);
  const std::vector<std::string> tier = {"serve", "-m", model(), "--port", "0", "--kv-disk", dir + "/tier",
                                         "--kv-key-file", dir + "/tier.key"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = tier;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  std::string out, err;
  for (const auto& [extra, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--no-prefix-cache"}, "the tier would store nothing"},
           {{"--kv-tier-queue", "1KiB"}, "below one block"},
           {{"--kv-tier-queue", "0"}, "below one block"},
           // Audit 9 L6: refused at start, not at the first write.
           {{"--kv-disk-size", "1KiB"}, "--kv-disk-size 1KiB is below one entry of this model's KV"}}) {
    EXPECT_EQ(test::run_kvserve(with(extra), &out, &err), 1) << extra[0];
    EXPECT_NE(err.find(says), std::string::npos) << extra[0] << ": " << err;
  }
  // A tier's options without a tier (audit 9 L7) are refused, not ignored.
  expect_refused({{{"serve", "-m", model(), "--port", "0", "--kv-disk-size", "1GiB"}, "--kv-disk-size configures a KV tier"},
                  {{"serve", "-m", model(), "--port", "0", "--kv-retention", "5"}, "--kv-retention configures a KV tier"},
                  {{"serve", "-m", model(), "--port", "0", "--kv-disk", ""}, "--kv-disk is empty"},
                  // Audit 9 L9: TLS is named as unsupported.
                  {{"serve", "-m", model(), "--port", "0", "--kv-redis", "rediss://h:6379"}, "no TLS"},
                  {{"serve", "-m", model(), "--port", "0", "--kv-disk", dir + "/tier", "--kv-redis-password-file",
                    dir + "/pw"},
                   "no --kv-redis is given"},
                  {{"serve", "-m", model(), "--port", "0", "--kv-redis", "redis://alice@127.0.0.1:1"},
                   "names the user 'alice' without a password"},
                  {{"serve", "-m", model(), "--port", "0", "--kv-redis", "redis://:pw@127.0.0.1:1",
                    "--kv-redis-password-file", dir + "/pw"},
                   "keep only the file"}});
}

// Audit 9 L2, L3, L4: the session folder is checked when chat starts, not at
// the first /save (a file there is refused; a folder others may list gets a
// note); a passphrase and a key file together are refused, as only one keys.
TEST(CliArgs, ChatSessionOptionsAreCheckedAtStart) {
  const std::string dir = test::temp_dir() + "/chat-folder";
  fs::create_directories(dir);
  std::ofstream(dir + "/afile") << "hi\n";
  setenv("KVS_TEST_PASS", "correct horse", 1);
  expect_refused({{{"chat", "-m", model(), "-t", "1", "--session-dir", dir + "/afile"}, "is not a folder"},
                  {{"chat", "-m", model(), "-t", "1", "--session-dir", dir + "/afile/sub"}, "is not a folder"},
                  {{"chat", "-m", model(), "-t", "1", "--session-dir", dir + "/s", "--passphrase-env", "KVS_TEST_PASS",
                    "--key-file", dir + "/k.key"},
                   "--passphrase-env and --key-file"}});
  unsetenv("KVS_TEST_PASS");
  fs::create_directories(dir + "/loose");
  ::chmod((dir + "/loose").c_str(), 0755);
  std::string out, err;
  ASSERT_EQ(test::run_kvserve_input({"chat", "-m", model(), "-t", "1", "-n", "8", "--no-device-monitor",
                                     "--session-dir", dir + "/loose"},
                                    "/quit\n", &out, &err),
            0)
      << err;
  EXPECT_NE(err.find("has mode 0755"), std::string::npos) << err;
  EXPECT_NE(err.find("chmod 700 " + dir + "/loose"), std::string::npos) << err;
}
