// Helpers shared by the test executables.
#pragma once
#include <string>
#include <vector>

namespace kvs::test {

// Absolute path of a file under ../shared (the read-only data the tests use).
std::string shared(const std::string& rel);
bool shared_available();
std::string read_file(const std::string& path);
// Runs the kvserve binary with `args` (shell-quoted here); captures stdout
// (and stderr into `err` when given). Returns the exit status.
int run_kvserve(const std::vector<std::string>& args, std::string* out, std::string* err = nullptr);
// A fresh temporary directory for this test process.
std::string temp_dir();
// Little-endian float16 file -> floats.
std::vector<float> read_f16_file(const std::string& path);

}  // namespace kvs::test
