#include "events/curve_keys.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace kvs::events {

namespace {

// The quoted value of `name = "..."`, or "" when the line is absent.
std::string value_of(const std::string& text, const std::string& name, const std::string& source) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find(name);
    if (at == std::string::npos) continue;
    const size_t q1 = line.find('"', at + name.size());
    const size_t q2 = q1 == std::string::npos ? q1 : line.find('"', q1 + 1);
    if (q2 == std::string::npos) throw std::runtime_error(source + ": " + name + " has no quoted value");
    const std::string v = line.substr(q1 + 1, q2 - q1 - 1);
    if (v.size() != 40) throw std::runtime_error(source + ": " + name + " must be 40 Z85 characters");
    return v;
  }
  return "";
}

}  // namespace

CurveKeys parse_curve_keys(const std::string& text, const std::string& source) {
  CurveKeys k;
  k.public_key = value_of(text, "public-key", source);
  k.secret_key = value_of(text, "secret-key", source);
  if (k.public_key.empty()) throw std::runtime_error(source + ": no public-key = \"...\" line (a ZeroMQ certificate)");
  return k;
}

CurveKeys read_curve_keyfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("--kv-events-curve: cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_curve_keys(ss.str(), path);
}

}  // namespace kvs::events
