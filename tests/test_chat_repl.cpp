// ChatRepl (src/chat/chat_repl.h) over string streams: commands, multi-line
// input, /stats contents, and the device monitor's plan (a fake hot tree
// caps replies; a critical one declines the message with a note), and
// `kvserve chat --ram-budget` keeping the options given beside it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/chat_repl.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvs;
namespace fs = std::filesystem;

namespace {

#define SKIP_WITHOUT_SHARED() \
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present"

struct Fixture {
  std::shared_ptr<const Model> model = Model::load(test::shared("models/stories260K/stories260K.gguf"));
  std::unique_ptr<Tokenizer> tok = Tokenizer::create(model->vocab());
  Engine engine{model, EngineOptions{1}};
  chat::ChatSession session{engine, *tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), opts()};
  static chat::ChatOptions opts() {
    chat::ChatOptions o;
    o.hard_cap = 256;
    o.max_tokens = 32;
    o.sampling.temperature = 0;
    return o;
  }
};

void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s;
}

// A fake /sys with one thermal zone at `temp_c` (passive trip 80 C, critical 100 C).
std::string fake_sys(const std::string& name, double temp_c) {
  const fs::path root = fs::path(test::temp_dir()) / name;
  const fs::path z = root / "class/thermal/thermal_zone0";
  write(z / "temp", std::to_string(int(temp_c * 1000)) + "\n");
  write(z / "type", "x86_pkg_temp\n");
  write(z / "trip_point_0_type", "passive\n");
  write(z / "trip_point_0_temp", "80000\n");
  write(z / "trip_point_1_type", "critical\n");
  write(z / "trip_point_1_temp", "100000\n");
  return root.string();
}

std::unique_ptr<device::DeviceMonitor> monitor_on(const std::string& sys) {
  device::DeviceMonitorOptions o;
  o.roots.sysfs = sys;
  o.roots.procfs = sys + "/no-proc";
  o.roots.cgroup = sys + "/no-cgroup";
  o.min_interval_s = 0;
  o.log = [](const std::string&) {};
  return std::make_unique<device::DeviceMonitor>(o);
}

TEST(ChatRepl, CommandsMultiLineAndStats) {
  SKIP_WITHOUT_SHARED();
  Fixture f;
  std::istringstream in("Hello\n/stats\nfirst line \\\nsecond line\n\"\"\"\na\nb\n\"\"\"\n/help\n/bogus\n/reset\n/stats\n/quit\nnot read\n");
  std::ostringstream out;
  chat::ChatRepl repl(f.session, in, out);
  repl.run();
  const std::string s = out.str();
  EXPECT_NE(s.find("kv: "), std::string::npos) << s;
  EXPECT_NE(s.find("tpot: p50"), std::string::npos);
  EXPECT_NE(s.find("window: hard cap 256"), std::string::npos);
  EXPECT_NE(s.find("summary: 0 tokens (none yet)"), std::string::npos);
  EXPECT_NE(s.find("device: not monitored"), std::string::npos);
  EXPECT_NE(s.find("/reset"), std::string::npos);
  EXPECT_NE(s.find("unknown command /bogus"), std::string::npos);
  EXPECT_NE(s.find("(conversation cleared)"), std::string::npos);
  EXPECT_EQ(f.session.stats().turns_kept, 0);  // /reset
  const std::string joined = f.session.conversation().render("x");
  EXPECT_EQ(joined.find("Hello"), std::string::npos);  // cleared by /reset
}

TEST(ChatRepl, MultiLineMessagesKeepTheirNewlines) {
  SKIP_WITHOUT_SHARED();
  Fixture f;
  std::istringstream in("one \\\ntwo\n\"\"\"\nthree\nfour\n\"\"\"\n");
  std::ostringstream out;
  chat::ChatRepl repl(f.session, in, out);
  repl.run();
  ASSERT_EQ(f.session.conversation().turns().size(), 2u);
  EXPECT_EQ(f.session.conversation().turns()[0].user, "one \ntwo");
  EXPECT_EQ(f.session.conversation().turns()[1].user, "three\nfour");
}

TEST(ChatRepl, HotDeviceShortensRepliesAndCriticalDeclines) {
  SKIP_WITHOUT_SHARED();
  Fixture f;
  auto hot = monitor_on(fake_sys("hot", 82));
  std::istringstream in("Once upon a time\n/stats\n");
  std::ostringstream out;
  chat::ChatRepl repl(f.session, in, out, hot.get());
  repl.run();
  EXPECT_EQ(hot->state().level, device::DeviceLevel::Hot);
  EXPECT_LE(f.session.stats().max_tokens, 8);  // a quarter of 32
  EXPECT_NE(out.str().find("device: hot (thermal"), std::string::npos) << out.str();

  Fixture g;
  auto crit = monitor_on(fake_sys("crit", 97));
  std::istringstream in2("Once upon a time\n");
  std::ostringstream out2;
  chat::ChatRepl repl2(g.session, in2, out2, crit.get());
  repl2.run();
  EXPECT_NE(out2.str().find("the device is critical"), std::string::npos) << out2.str();
  EXPECT_EQ(g.session.conversation().turns().size(), 0u);
}

// `kvserve chat` on stories260K, reading `input`; the exit status.
int chat_cli(const std::vector<std::string>& extra, const std::string& input, std::string* out, std::string* err) {
  std::vector<std::string> args = {"chat", "-m", test::shared("models/stories260K/stories260K.gguf"), "-t", "1",
                                   "--temp", "0", "--no-device-monitor", "--session-dir",
                                   test::temp_dir() + "/budget-sessions"};
  args.insert(args.end(), extra.begin(), extra.end());
  return test::run_kvserve_input(args, input, out, err);
}

// Audit defect: --ram-budget replaced an explicit --kv-type and --window
// silently. Given options win; the budget fills in the rest and says so.
TEST(ChatCli, RamBudgetKeepsTheOptionsGivenAndSaysWhatItChose) {
  SKIP_WITHOUT_SHARED();
  std::string out, err;
  ASSERT_EQ(chat_cli({"--ram-budget", "100MiB", "--kv-type", "f32"}, "/stats\n", &out, &err), 0) << err;
  EXPECT_NE(out.find("; f32"), std::string::npos) << out;
  EXPECT_NE(err.find("kept as given: --kv-type f32"), std::string::npos) << err;
  EXPECT_NE(err.find("chose hard cap"), std::string::npos) << err;

  ASSERT_EQ(chat_cli({"--ram-budget", "100MiB", "-c", "256", "--window", "200"}, "/stats\n", &out, &err), 0) << err;
  EXPECT_NE(out.find("window: hard cap 256 tokens, 200 kept"), std::string::npos) << out;
  EXPECT_NE(err.find("chose int8 KV"), std::string::npos) << err;
  EXPECT_NE(err.find("kept as given: -c 256, --window 200"), std::string::npos) << err;

  // Nothing given: the planner's full description, and its one-line choice.
  ASSERT_EQ(chat_cli({"--ram-budget", "100MiB"}, "/stats\n", &out, &err), 0) << err;
  EXPECT_NE(err.find("quality price: int8"), std::string::npos) << err;
  EXPECT_NE(err.find("chose int8 KV (keys/channel), hard cap 512, window 256"), std::string::npos) << err;
  EXPECT_EQ(err.find("kept as given"), std::string::npos) << err;
}

TEST(ChatCli, RamBudgetRefusesGivenOptionsThatDoNotFitAndNamesThem) {
  SKIP_WITHOUT_SHARED();
  std::string out, err;
  // 2 MiB holds stories260K's full 512-token context in int8, not in f32.
  EXPECT_NE(chat_cli({"--ram-budget", "2MiB", "--kv-type", "f32", "-c", "512"}, "", &out, &err), 0);
  EXPECT_NE(err.find("--kv-type f32"), std::string::npos) << err;
  EXPECT_NE(err.find("-c 512"), std::string::npos) << err;
  // Without -c the f32 KV gets a shorter hard cap, said on stderr.
  ASSERT_EQ(chat_cli({"--ram-budget", "2MiB", "--kv-type", "f32"}, "/stats\n", &out, &err), 0) << err;
  EXPECT_NE(out.find("; f32"), std::string::npos) << out;
  EXPECT_NE(err.find("chose hard cap"), std::string::npos) << err;
  EXPECT_EQ(out.find("hard cap 512 "), std::string::npos) << out;
  // A window the budget's hard cap cannot hold.
  EXPECT_NE(chat_cli({"--ram-budget", "2MiB", "--kv-type", "f32", "--window", "400"}, "", &out, &err), 0);
  EXPECT_NE(err.find("--window 400"), std::string::npos) << err;
}

}  // namespace
