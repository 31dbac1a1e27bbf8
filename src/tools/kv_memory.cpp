#include "tools/kv_memory.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tools/units.h"

namespace kvs::tools {

uint64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    uint64_t kib = 0;
    std::string unit;
    if (in >> kib >> unit && unit == "kB") return kib * 1024;
  }
  throw std::runtime_error("cannot read MemAvailable from /proc/meminfo; give --kv-memory as a size (e.g. 2GiB)");
}

static bool is_share(const std::string& s) {
  return !s.empty() && (s.back() == '%' || (s.size() > 1 && s[0] == '0' && s[1] == '.'));
}

uint64_t parse_kv_memory(const std::string& s) { return parse_kv_memory(s, is_share(s) ? available_memory_bytes() : 0); }

uint64_t parse_kv_memory(const std::string& s, uint64_t available) {
  const char* forms = "a size like 2GiB / 512MiB / 1500000000, or a share of available memory like 40% or 0.4";
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("invalid --kv-memory '" + s + "': " + why + " (expected " + forms + ")");
  };
  if (s.empty()) throw bad("empty");
  double share = -1;
  if (s.back() == '%') {
    const std::string num = s.substr(0, s.size() - 1);
    if (num.empty() || num.find_first_not_of("0123456789.") != std::string::npos) throw bad("not a percentage");
    share = std::stod(num) / 100.0;
  } else if (is_share(s)) {
    if (s.find_first_not_of("0123456789.", 2) != std::string::npos || s.size() == 2) throw bad("not a share");
    share = std::stod(s);
  }
  if (share >= 0) {
    if (!(share > 0 && share <= 1)) throw bad("a share must be in (0, 1]");
    if (available == 0) throw bad("available memory unknown");
    return uint64_t(std::floor(double(available) * share));
  }
  uint64_t bytes = 0;
  try {
    bytes = parse_size(s);
  } catch (const std::invalid_argument& e) {
    throw bad(e.what());
  }
  if (bytes == 0) throw bad("zero bytes");
  return bytes;
}

}  // namespace kvs::tools
