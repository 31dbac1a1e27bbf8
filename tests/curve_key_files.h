// CURVE key pairs and `--kv-events-curve` key files for tests
// (src/events/curve_keys.h has the format).
#pragma once
#include <zmq.h>

#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.h"

namespace kvs::test {

struct CurvePair {
  std::string pub, sec;  // Z85
};

inline CurvePair curve_pair() {
  char p[41], s[41];
  if (zmq_curve_keypair(p, s) != 0) throw std::runtime_error("zmq_curve_keypair failed (libzmq without CURVE?)");
  return {p, s};
}

// A key file in temp_dir(): `own`'s pair, then `server-key` when not empty,
// then one client-key line per key in `clients`.
inline std::string curve_key_file(const std::string& name, const CurvePair& own, const std::string& server_key = "",
                                  const std::vector<std::string>& clients = {}) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream f(path);
  f << "#   a kvserve --kv-events-curve key file\ncurve\n";
  f << "    public-key = \"" << own.pub << "\"\n    secret-key = \"" << own.sec << "\"\n";
  if (!server_key.empty()) f << "    server-key = \"" << server_key << "\"\n";
  for (const std::string& c : clients) f << "    client-key = \"" << c << "\"\n";
  return path;
}

}  // namespace kvs::test
