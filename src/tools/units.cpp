// Hand-written grammar for sizes and rates (see units.h). We parse the number
// ourselves instead of using strtod so that forms like "1e3", " 5", "+5",
// "0x10" or "inf" are rejected rather than accepted by accident.
#include "tools/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>
#include <vector>

namespace kvs::tools {
namespace {

// Splits "12.5GiB" into (12.5, "GiB"); throws if the number part is malformed.
std::pair<double, std::string> split_number(const std::string& s, const char* what, const char* forms) {
  size_t i = 0;
  const auto fail = [&](const std::string& why) {
    return std::invalid_argument("invalid " + std::string(what) + " '" + s + "': " + why + " (expected " + forms + ")");
  };
  if (s.empty()) throw fail("empty");
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  const size_t int_digits = i;
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++frac_digits;
    if (frac_digits == 0) throw fail("a '.' must be followed by digits");
  }
  if (int_digits == 0) throw fail("it must start with a digit");
  if (int_digits > 18) throw fail("number too large");
  const double v = std::stod(s.substr(0, i));
  return {v, s.substr(i)};
}

struct Unit {
  const char* name;
  double mult;
};

}  // namespace

uint64_t parse_size(const std::string& s) {
  static const char* forms = "a number with an optional unit B, KiB, MiB, GiB, TiB, KB, MB, GB or TB, e.g. 24GiB";
  auto [v, unit] = split_number(s, "size", forms);
  static const std::vector<Unit> units = {
      {"", 1},           {"B", 1},
      {"KiB", 1024.0},   {"kiB", 1024.0},  {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3},       {"kB", 1e3},      {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
  };
  for (const Unit& u : units) {
    if (unit != u.name) continue;
    const double bytes = v * u.mult;
    if (!(bytes < 1.8e19)) throw std::invalid_argument("invalid size '" + s + "': too large");
    const double r = std::round(bytes);
    if (std::fabs(bytes - r) > 1e-6 * std::max(1.0, bytes) && u.mult == 1)
      throw std::invalid_argument("invalid size '" + s + "': a byte count must be whole");
    return uint64_t(r);
  }
  throw std::invalid_argument("invalid size '" + s + "': unknown unit '" + unit + "' (expected " + forms + ")");
}

double parse_bandwidth(const std::string& s) {
  std::string body = s;
  if (body.size() >= 2 && body.compare(body.size() - 2, 2, "/s") == 0) body.resize(body.size() - 2);
  try {
    // A bare number is ambiguous (80 what?): bandwidth needs an explicit unit.
    if (body.empty() || std::isdigit(static_cast<unsigned char>(body.back()))) throw std::invalid_argument("no unit");
    const uint64_t b = parse_size(body);
    if (b == 0) throw std::invalid_argument("zero");
    return double(b);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("invalid bandwidth '" + s +
                                "' (expected a positive size per second, e.g. 80GB/s, 25.6GiB/s or 900MB/s)");
  }
}

double parse_flops(const std::string& s) {
  static const char* forms = "a positive number with an optional K, M, G, T or P prefix, e.g. 1T, 800G or 1.5TFLOPS";
  auto [v, rest] = split_number(s, "compute rate", forms);
  double mult = 1;
  if (!rest.empty()) {
    switch (rest[0]) {
      case 'K': case 'k': mult = 1e3; break;
      case 'M': mult = 1e6; break;
      case 'G': mult = 1e9; break;
      case 'T': mult = 1e12; break;
      case 'P': mult = 1e15; break;
      default: mult = 0;
    }
    if (mult != 0) rest = rest.substr(1);
    else mult = 1;
  }
  static const std::vector<std::string> suffixes = {"", "FLOPS", "FLOP/s", "flops", "OPS", "OP/s", "ops"};
  bool ok = false;
  for (const auto& suf : suffixes) ok = ok || rest == suf;
  if (!ok) throw std::invalid_argument("invalid compute rate '" + s + "': unknown unit '" + rest + "' (expected " + forms + ")");
  if (!(v > 0)) throw std::invalid_argument("invalid compute rate '" + s + "': must be positive");
  return v * mult;
}

std::string format_bytes(double bytes) {
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int k = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && k < 5) v /= 1024.0, ++k;
  char buf[64];
  if (k == 0 || std::fabs(v - std::round(v)) < 0.005) std::snprintf(buf, sizeof buf, "%.0f %s", v, names[k]);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, names[k]);
  return buf;
}

std::string format_si(double v, const std::string& unit) {
  static const char* pre[] = {"", "K", "M", "G", "T", "P", "E"};
  int k = 0;
  double x = v;
  while (std::fabs(x) >= 1000.0 && k < 6) x /= 1000.0, ++k;
  char buf[64];
  if (std::fabs(x) >= 100 || std::fabs(x - std::round(x)) < 0.005) std::snprintf(buf, sizeof buf, "%.0f %s%s", x, pre[k], unit.c_str());
  else if (std::fabs(x) >= 10) std::snprintf(buf, sizeof buf, "%.1f %s%s", x, pre[k], unit.c_str());
  else std::snprintf(buf, sizeof buf, "%.2f %s%s", x, pre[k], unit.c_str());
  return buf;
}

std::string format_int(int64_t v) {
  std::string d = std::to_string(v < 0 ? -(v + 1) + 1ull : uint64_t(v));
  std::string out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string format_ratio(double r) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2fx", r);
  return b;
}

}  // namespace kvs::tools
