// The project's own scripts: misuse fails with a clear message, not a
// Python traceback or a half-run benchmark.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct Ran {
  int status = -1;
  std::string out;
};

Ran sh(const std::string& cmd) {
  Ran r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace

TEST(Scripts, BenchVsPeerWithoutThePeerSaysHowToBuildIt) {
  const std::string script = std::string(KVS_SOURCE_DIR) + "/scripts/bench-vs-peer.sh";
  Ran r = sh("bash '" + script + "'");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("usage: bash scripts/bench-vs-peer.sh PEER_BIN_DIR"), std::string::npos) << r.out;
  r = sh("bash '" + script + "' /nonexistent-peer-dir");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("/nonexistent-peer-dir/llama-bench not found"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("build-llama-cpp.sh"), std::string::npos) << r.out;
}

TEST(Scripts, ArchGoldensWithoutThePeersSaysHowToBuildThem) {
  const std::string script = std::string(KVS_SOURCE_DIR) + "/scripts/arch-goldens.py";
  Ran r = sh("python3 '" + script + "'");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("usage:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Traceback"), std::string::npos) << r.out;
  r = sh("python3 '" + script + "' --kvserve /nonexistent/kvserve --llama-cpp /x --ik-llama /y");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("/nonexistent/kvserve is not an executable kvserve"), std::string::npos) << r.out;
  r = sh("python3 '" + script + "' --kvserve /bin/true --llama-cpp /nonexistent-a --ik-llama /nonexistent-b");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("build-llama-cpp.sh"), std::string::npos) << r.out;
}
