// Helpers shared by the test executables.
#pragma once
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvs::test {

// Absolute path of a file under ../shared (the read-only data the tests use).
std::string shared(const std::string& rel);
bool shared_available();
std::string read_file(const std::string& path);
// Runs the kvserve binary with `args` (shell-quoted here); captures stdout
// (and stderr into `err` when given). Returns the exit status.
int run_kvserve(const std::vector<std::string>& args, std::string* out, std::string* err = nullptr);
// The same with `input` as the process's standard input.
int run_kvserve_input(const std::vector<std::string>& args, const std::string& input, std::string* out,
                      std::string* err = nullptr);
// A fresh temporary directory for this test process.
std::string temp_dir();
// max |a[i] - b[i]| and max |a[i]| over equal-length vectors.
std::pair<double, double> max_diff_and_abs(const std::vector<float>& a, const std::vector<float>& b);
// Little-endian float16 file -> floats.
std::vector<float> read_f16_file(const std::string& path);

// Polls `pred` every 50 ms until it holds, for at most `timeout_s`; its
// last value.
template <class F>
bool eventually(F pred, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

}  // namespace kvs::test
