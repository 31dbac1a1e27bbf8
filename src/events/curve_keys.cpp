#include "events/curve_keys.h"

#include <zmq.h>

#include <array>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace kvs::events {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

// A key is 40 Z85 characters that decode to 32 bytes.
void check_z85(const std::string& v, const std::string& name, const std::string& source) {
  std::array<uint8_t, 32> raw{};
  if (v.size() != 40 || zmq_z85_decode(raw.data(), v.c_str()) == nullptr)
    throw std::runtime_error(source + ": " + name + " must be 40 Z85 characters (a CURVE key)");
}

void set_once(std::string& slot, const std::string& v, const std::string& name, const std::string& source) {
  if (!slot.empty()) throw std::runtime_error(source + ": " + name + " appears twice");
  slot = v;
}

void check_pair(const CurveKeys& k, const std::string& source, const char* end) {
  if (k.public_key.empty() || k.secret_key.empty())
    throw std::runtime_error(source + ": " + end + " needs its own key pair (public-key and secret-key lines)");
  char derived[41];
  if (zmq_curve_public(derived, k.secret_key.c_str()) != 0 || k.public_key != derived)
    throw std::runtime_error(source + ": public-key does not belong to secret-key");
}

}  // namespace

CurveKeys parse_curve_keys(const std::string& text, const std::string& source, CurveEnd end) {
  CurveKeys k;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    line = trim(line);
    const size_t eq = line.find('=');
    if (line.empty() || line[0] == '#' || eq == std::string::npos) continue;
    const std::string name = trim(line.substr(0, eq)), quoted = trim(line.substr(eq + 1));
    if (name != "public-key" && name != "secret-key" && name != "server-key" && name != "client-key") continue;
    if (quoted.size() < 2 || quoted.front() != '"' || quoted.back() != '"')
      throw std::runtime_error(source + ": " + name + " has no quoted value");
    const std::string v = quoted.substr(1, quoted.size() - 2);
    check_z85(v, name, source);
    if (name == "public-key") set_once(k.public_key, v, name, source);
    if (name == "secret-key") set_once(k.secret_key, v, name, source);
    if (name == "server-key") set_once(k.server_key, v, name, source);
    if (name == "client-key") k.client_keys.push_back(v);
  }
  if (end == CurveEnd::Worker) {
    check_pair(k, source, "a worker");
  } else {
    check_pair(k, source, "a subscriber");
    if (k.server_key.empty())
      throw std::runtime_error(source + ": no server-key = \"...\" line (the workers' public key)");
  }
  return k;
}

CurveKeys read_curve_keyfile(const std::string& path, CurveEnd end) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("--kv-events-curve: cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_curve_keys(ss.str(), "--kv-events-curve " + path, end);
}

}  // namespace kvs::events
