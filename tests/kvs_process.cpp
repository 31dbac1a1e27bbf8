#include "kvs_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <stdexcept>
#include <thread>

#include "sched/clock.h"
#include "test_util.h"

namespace kvs::test {

namespace {

using sched::steady_now;

std::vector<std::string> serve_args(const std::vector<std::string>& args) {
  std::vector<std::string> a = {"serve", "--host", "127.0.0.1", "--port", "0"};
  a.insert(a.end(), args.begin(), args.end());
  return a;
}

}  // namespace

KvsProcess::KvsProcess(std::vector<std::string> args, const std::string& ready, double timeout_s) {
  static int counter = 0;
  log_path_ = temp_dir() + "/kvs-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".log";
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe");
  std::vector<std::string> full = {KVS_BINARY};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : full) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork");
  if (pid_ == 0) {
    dup2(out[1], 1);
    const int err = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) dup2(err, 2);
    close(out[0]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  out_fd_ = out[0];
  const std::regex re(ready);
  std::string line;
  const double t0 = steady_now();
  while (steady_now() - t0 < timeout_s) {
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char c;
    if (read(out_fd_, &c, 1) != 1) break;
    if (c != '\n') {
      line += c;
      continue;
    }
    lines_.push_back(line);
    line.clear();
    if (std::regex_search(lines_.back(), re)) return;
  }
  kill9();
  close(out_fd_);
  out_fd_ = -1;
  throw std::runtime_error("kvserve did not print /" + ready + "/; log:\n" + log());
}

KvsProcess::~KvsProcess() {
  kill9();
  if (out_fd_ >= 0) close(out_fd_);
}

std::string KvsProcess::find(const std::string& re) const {
  const std::regex r(re);
  for (const auto& l : lines_) {
    std::smatch m;
    if (std::regex_search(l, m, r) && m.size() > 1) return m[1];
  }
  return "";
}

int KvsProcess::port() const {
  const std::string p = find("listening on http://[0-9.]+:([0-9]+)");
  return p.empty() ? 0 : std::stoi(p);
}

int KvsProcess::stop(double timeout_s) {
  if (pid_ <= 0) return status_;
  kill(pid_, SIGTERM);
  const double t0 = steady_now();
  int status = -1, st = 0;
  while (steady_now() - t0 < timeout_s) {
    const pid_t w = waitpid(pid_, &st, WNOHANG);
    if (w == pid_) {
      status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      pid_ = -1;
      break;
    }
    if (w < 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill9();
  status_ = status;
  if (status != 0) std::fprintf(stderr, "kvserve exited with status %d; its log:\n%s\n", status, log().c_str());
  return status;
}

void KvsProcess::kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

// Without reaping it, so that stop() still reads its status.
bool KvsProcess::alive() const {
  if (pid_ <= 0) return false;
  siginfo_t si{};
  return waitid(P_PID, id_t(pid_), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == 0;
}

std::string KvsProcess::log() const {
  try {
    return read_file(log_path_);
  } catch (const std::exception&) {
    return "";
  }
}

ServeProcess::ServeProcess(const std::vector<std::string>& args)
    : KvsProcess(serve_args(args), "listening on http://[0-9.]+:[0-9]+") {}

ServeProcess::~ServeProcess() {
  if (pid() > 0) {
    EXPECT_EQ(stop(), 0);
  }
}

}  // namespace kvs::test
