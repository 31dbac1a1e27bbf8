// `kvserve chat` in a real terminal: tmux starts it on stories260K, the test
// types with `send-keys` and reads the screen with `capture-pane`. Checks a
// streamed reply, multi-line input, /stats, /quit, and that the process holds
// no socket (no network listener). Every wait is bounded. capture-pane
// trims trailing blanks, so prompts are matched without theirs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;

std::string sh(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

class Tmux {
 public:
  // A socket of its own per instance: a server still shutting down must not
  // swallow the next session.
  Tmux() : sock_("kvs-chat-test-" + std::to_string(::getpid()) + "-" + std::to_string(next_id_++)) {}
  ~Tmux() { sh(tmux("kill-server") + " 2>/dev/null"); }
  std::string tmux(const std::string& args) const { return "tmux -L " + sock_ + " " + args; }
  void start(const std::string& command) {
    sh(tmux("new-session -d -s chat -x 160 -y 60 '" + command + "'"));
    sh(tmux("set-option -t chat remain-on-exit on"));
  }
  void keys(const std::string& literal) { sh(tmux("send-keys -t chat -l '" + literal + "'")); }
  void enter() { sh(tmux("send-keys -t chat Enter")); }
  std::string screen() const { return sh(tmux("capture-pane -p -S -200 -t chat")); }
  std::string pane(const std::string& fmt) const { return sh(tmux("display-message -p -t chat '" + fmt + "'")); }
  // Waits until `pred(screen)` holds; false after timeout_s.
  template <class P>
  bool wait_for(P pred, double timeout_s) const {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      if (pred(screen())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

 private:
  std::string sock_;
  static inline int next_id_ = 0;
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

bool holds_a_socket(const std::string& pid) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + pid + "/fd", ec)) {
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:", 0) == 0) return true;
  }
  return false;
}

TEST(ChatTmux, TypesAMessageReadsTheReplyAndStats) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared not present";
  if (sh("command -v tmux").empty()) GTEST_SKIP() << "tmux is not installed (Debian package tmux)";
  Tmux t;
  // The exit status goes to a file: tmux sometimes marks the pane dead
  // without ever recording the status of the process inside it.
  const std::string status_file = kvs::test::temp_dir() + "/chat-exit-status";
  fs::remove(status_file);
  t.start(std::string(KVS_BINARY) + " chat -m " + kvs::test::shared("models/stories260K/stories260K.gguf") +
          " --temp 0 -n 24 -c 256 -t 1 --no-device-monitor; echo $? > " + status_file);
  ASSERT_TRUE(t.wait_for([](const std::string& s) { return s.find(">>>") != std::string::npos; }, 60)) << t.screen();
  t.keys("Once upon a time");
  t.enter();
  ASSERT_TRUE(t.wait_for([](const std::string& s) { return count(s, ">>>") >= 2; }, 60)) << t.screen();
  // A multi-line message: the backslash continues, the prompt changes.
  t.keys("Tell me \\");
  t.enter();
  ASSERT_TRUE(t.wait_for([](const std::string& s) { return s.find("...") != std::string::npos; }, 30)) << t.screen();
  t.keys("about a dog");
  t.enter();
  ASSERT_TRUE(t.wait_for([](const std::string& s) { return count(s, ">>>") >= 3; }, 60)) << t.screen();
  const std::string pid = t.pane("#{pane_pid}");
  ASSERT_FALSE(pid.empty());
  EXPECT_FALSE(holds_a_socket(pid.substr(0, pid.find('\n')))) << "kvserve chat must not open sockets";
  t.keys("/stats");
  t.enter();
  ASSERT_TRUE(t.wait_for([](const std::string& s) { return s.find("device: not monitored") != std::string::npos; }, 30))
      << t.screen();
  const std::string s = t.screen();
  EXPECT_NE(s.find("kv: "), std::string::npos) << s;
  EXPECT_NE(s.find("2 turns kept"), std::string::npos) << s;
  EXPECT_NE(s.find("tpot: p50"), std::string::npos) << s;
  t.keys("/quit");
  t.enter();
  ASSERT_TRUE(t.wait_for([&](const std::string&) { return t.pane("#{pane_dead}").rfind("1", 0) == 0; }, 30))
      << t.screen();
  std::string status;
  for (int i = 0; i < 100 && status.empty(); ++i) {
    status = sh("cat " + status_file + " 2>/dev/null");
    if (status.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, "0\n") << "kvserve chat's exit status after /quit";
}

// /save in one chat, --resume in the next (the KV comes back, no recompute),
// /logout shreds the folder.
TEST(ChatTmux, SaveResumeAndLogout) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared not present";
  if (sh("command -v tmux").empty()) GTEST_SKIP() << "tmux is not installed (Debian package tmux)";
  const std::string dir = kvs::test::temp_dir() + "/tmux-sessions";
  fs::remove_all(dir);
  const std::string chat = std::string(KVS_BINARY) + " chat -m " +
                           kvs::test::shared("models/stories260K/stories260K.gguf") +
                           " --temp 0 -n 16 -c 256 -t 1 --no-device-monitor --session-dir " + dir;
  {
    Tmux t;
    t.start(chat);
    ASSERT_TRUE(t.wait_for([](const std::string& s) { return s.find(">>>") != std::string::npos; }, 60)) << t.screen();
    t.keys("Once upon a time");
    t.enter();
    ASSERT_TRUE(t.wait_for([](const std::string& s) { return count(s, ">>>") >= 2; }, 60)) << t.screen();
    t.keys("/save tale");
    t.enter();
    ASSERT_TRUE(t.wait_for([](const std::string& s) { return s.find("(saved session 'tale'") != std::string::npos; }, 30))
        << t.screen();
    t.keys("/quit");
    t.enter();
    ASSERT_TRUE(t.wait_for([&](const std::string&) { return t.pane("#{pane_dead}").rfind("1", 0) == 0; }, 30));
  }
  Tmux t;
  t.start(chat + " --resume tale");
  ASSERT_TRUE(t.wait_for([](const std::string& s) { return s.find(">>>") != std::string::npos; }, 60)) << t.screen();
  EXPECT_NE(t.screen().find("resumed session 'tale': 1 turns"), std::string::npos) << t.screen();
  t.keys("/logout");
  t.enter();
  ASSERT_TRUE(t.wait_for([](const std::string& s) { return s.find("(logged out: 2 files shredded") != std::string::npos; }, 30))
      << t.screen();
  ASSERT_TRUE(t.wait_for([&](const std::string&) { return t.pane("#{pane_dead}").rfind("1", 0) == 0; }, 30));
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace
