#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "kernels/quant.h"

namespace kvs::test {

std::string shared(const std::string& rel) { return std::string(KVS_SHARED_DIR) + "/" + rel; }

bool shared_available() { return std::filesystem::exists(shared("models/stories260K/stories260K.gguf")); }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

int run_kvserve(const std::vector<std::string>& args, std::string* out, std::string* err) {
  return run_kvserve_input(args, "", out, err);
}

int run_kvserve_input(const std::vector<std::string>& args, const std::string& input, std::string* out,
                      std::string* err) {
  std::string dir = temp_dir();
  std::string cmd = quote(KVS_BINARY);
  for (const auto& a : args) cmd += " " + quote(a);
  std::string errf = dir + "/stderr.txt";
  std::string inf = "/dev/null";
  if (!input.empty()) {
    inf = dir + "/stdin.txt";
    std::ofstream(inf, std::ios::binary) << input;
  }
  cmd += " 2>" + quote(errf) + " <" + quote(inf);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed");
  std::string o;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) o.append(buf, n);
  int st = pclose(p);
  if (out) *out = o;
  if (err) *err = read_file(errf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string temp_dir() {
  static std::string dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvs-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    return tmpl;
  }();
  return dir;
}

std::pair<double, double> max_diff_and_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(a[i])));
  }
  return {d, m};
}

std::vector<float> read_f16_file(const std::string& path) {
  std::string raw = read_file(path);
  std::vector<float> out(raw.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h = uint16_t(uint8_t(raw[2 * i])) | uint16_t(uint8_t(raw[2 * i + 1])) << 8;
    out[i] = fp16_to_f32(h);
  }
  return out;
}

}  // namespace kvs::test
