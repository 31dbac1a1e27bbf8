// What the router's process tests share: kvserve workers on fixed free
// loopback ports (so a test can restart one where the router expects it),
// a router in front of them, and small request helpers.
#pragma once
#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "http_client.h"
#include "kvs_process.h"
#include "test_util.h"

namespace kvs::router_test {

using nlohmann::json;
using test::KvsProcess;

inline std::string stories() { return test::shared("models/stories260K/stories260K.gguf"); }
inline std::string tiny_llama() { return test::shared("models/tiny-random/tiny-llama-f16.gguf"); }

inline std::string secret_file() {
  const std::string p = test::temp_dir() + "/cluster.secret";
  std::ofstream(p) << "0123456789abcdef0123456789abcdef";
  return p;
}

// A worker on fixed ports, so that it can be restarted where the router
// expects it.
struct Worker {
  int http = test::free_port(), events = test::free_port(), replay = test::free_port();
  std::unique_ptr<KvsProcess> p;
  std::vector<std::string> extra;
  bool with_events = true;
  std::string model = stories();

  void start() {
    std::vector<std::string> a = {"serve", "-m", model, "--port", std::to_string(http), "--threads", "1",
                                  "--cache-secret-file", secret_file()};
    if (with_events)
      for (const std::string& s : {std::string("--kv-events"), ep(events), std::string("--kv-events-replay"), ep(replay)})
        a.push_back(s);
    a.insert(a.end(), extra.begin(), extra.end());
    p = std::make_unique<KvsProcess>(a, with_events ? "kvserve: kv events on" : "listening on");
  }
  static std::string ep(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(http); }
  std::string spec() const { return url() + "," + ep(events) + "," + ep(replay); }
};

inline std::unique_ptr<KvsProcess> start_router(const std::vector<std::string>& worker_specs,
                                                std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"router", "-m", stories(), "--port", "0", "--cluster-secret", secret_file(),
                                "--startup-timeout", "20"};
  if (std::find(extra.begin(), extra.end(), "--health-interval") == extra.end())
    a.insert(a.end(), {"--health-interval", "0.2"});
  for (const auto& w : worker_specs) {
    a.push_back("--worker");
    a.push_back(w);
  }
  a.insert(a.end(), extra.begin(), extra.end());
  return std::make_unique<KvsProcess>(a, "kvserve router: listening on");
}

// Two workers, each started with `worker_extra`, and a router with
// `router_extra` in front of them.
struct TwoWorkers {
  Worker w0, w1;
  std::unique_ptr<KvsProcess> router;
  int port = 0;
  explicit TwoWorkers(const std::vector<std::string>& worker_extra = {},
                      const std::vector<std::string>& router_extra = {}) {
    for (Worker* w : {&w0, &w1}) {
      w->extra = worker_extra;
      w->start();
    }
    router = start_router({w0.spec(), w1.spec()}, router_extra);
    port = router->port();
  }
};

inline test::HttpReply complete(int port, const std::string& prompt, int max_tokens, bool stream = false,
                                size_t stop_after = 0) {
  const json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", stream}};
  return test::http_request(port, "POST", "/v1/completions", body.dump(), {}, 60, stop_after);
}

inline std::string routed_to(const std::string& url, int status = 200) {
  return "kvserve_router_requests_total{worker=\"" + url + "\",status=\"" + std::to_string(status) + "\"}";
}

inline std::string prefix(int k) {
  static const char* topics[] = {"a red ball in the garden", "a big boat on the sea", "a small cat under the tree",
                                 "a funny dog in the park"};
  std::string s;
  for (int i = 0; i < 6; ++i) s += "Once upon a time there was " + std::string(topics[k]) + ". ";
  return s;
}

#define REQUIRE_SHARED() \
  if (!test::shared_available()) GTEST_SKIP() << "needs ../shared"

}  // namespace kvs::router_test
