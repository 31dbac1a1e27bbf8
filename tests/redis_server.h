// A redis-server for tests: a free loopback port, no persistence, extra
// config arguments (--requirepass, --user ...); killed by the destructor.
// Every wait is bounded.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"

namespace kvs::test {

inline bool have_redis() {
  return std::system("command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1") == 0;
}

struct Redis {
  int port = free_port();
  pid_t pid = -1;
  std::vector<std::string> extra;  // e.g. {"--requirepass", "pw"}
  std::string user, password;      // who redis-cli (and the readiness probe) logs in as

  bool start() {
    std::vector<std::string> args = {"redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid = fork();
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execvp("redis-server", argv.data());
      _exit(127);
    }
    for (int i = 0; i < 250; ++i) {  // ready when it answers PONG
      if (connectable()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // redis-cli's output for `cmd` (arguments already shell-safe).
  std::string cli(const std::string& cmd) const {
    const std::string line = "timeout 5 redis-cli -p " + std::to_string(port) +
                             (user.empty() ? "" : " --user '" + user + "'") +
                             (password.empty() ? "" : " --no-auth-warning --pass '" + password + "'") + " " + cmd + " 2>&1";
    std::string out;
    if (FILE* f = ::popen(line.c_str(), "r")) {
      char buf[512];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
      ::pclose(f);
    }
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }
  bool connectable() const { return cli("ping") == "PONG"; }
  void kill9() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port); }
  ~Redis() { kill9(); }
};

}  // namespace kvs::test
