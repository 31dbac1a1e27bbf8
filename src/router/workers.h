// The router's workers: where they are, whether they are up, how loaded.
//
// `--worker URL[,EVENTS[,REPLAY]]`: the worker's HTTP base URL, its KV-event
// PUB endpoint and replay endpoint (default: the PUB port + 1).
//
// A health thread GETs each worker's /health and /metrics every interval:
// /health answering 200 with the expected model identity brings a worker
// (back) up; anything else keeps or marks it down with the reason. The
// proxy marks a worker down at once when it refuses or resets a request.
// Load = vllm:num_requests_waiting + vllm:num_requests_running from the last
// /metrics, plus the requests the router has in flight there.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "router/upstream.h"

namespace kvs::router {

// How long a worker's /health may take before the check marks it down.
inline constexpr double kHealthTimeoutS = 2.0;

struct WorkerSpec {
  std::string url;              // as given, for logs and labels
  HostPort http;
  std::string events, replay;   // empty: no KV events from this worker
};
// Throws std::runtime_error naming the bad part.
WorkerSpec parse_worker_spec(const std::string& s);

// What /health says about a worker's model.
struct ModelInfo {
  std::string model, identity;
  int block_size = 0;
  std::string prefix_protocol;  // kv/prefix_chain.h's fingerprint, as the worker computes it
  std::string vocab;            // model/vocab_fingerprint.h ("" from a worker too old to say)
  std::string chat_template;    // ChatTemplate::fingerprint() ("" from a worker too old to say)
  // Disaggregated serving: a decode worker's KV address (HOST:PORT), a
  // prefill worker's decode peers.
  std::string kv_listen;
  std::vector<std::string> decode_peers;
};

struct WorkerView {
  bool up = false;
  double load = 0;             // waiting + running + in flight
  int64_t inflight = 0;
  std::string down_reason;
  double waiting = 0, running = 0;                        // its last /metrics
  double kv_total = 0, kv_free = 0, kv_used = 0, kv_cached = 0;  // blocks, its last /metrics
  std::string kv_listen;                  // its last /health (decode workers)
  std::vector<std::string> decode_peers;  // its last /health (prefill workers)
  // What they resolve to (router/peer_address.h), for pairing by address;
  // empty: compare the strings only.
  std::vector<std::string> kv_listen_addrs;
  std::vector<std::vector<std::string>> decode_peer_addrs;  // one per decode_peers entry
};

class WorkerSet {
 public:
  explicit WorkerSet(std::vector<WorkerSpec> specs);
  ~WorkerSet();  // stops the health thread

  // The router's own -m: its vocabulary fingerprint and file, which every
  // worker's must equal (the router tokenizes prompts itself). Before
  // probe_all().
  void expect_vocab(std::string fingerprint, std::string model_file);
  // And its chat template (-m's, or --chat-template): every worker's must
  // render chat prompts alike, or the router hashes other text. Before
  // probe_all().
  void expect_chat_template(std::string fingerprint, std::string description);
  // Start-up: returns as soon as one worker answers /health with the
  // router's vocabulary (waiting up to `timeout_s`); the others are down,
  // their reasons logged, until the health thread lets them in. Workers
  // that answered in that same round must serve the same model identity and
  // block size; throws std::runtime_error naming the worker and both models
  // otherwise, or when no worker answered with the router's vocabulary. A
  // worker of another vocabulary is left out, its reason logged.
  ModelInfo probe_all(double timeout_s);
  // Starts the health thread. `on_up(i)`: worker i came (back) up;
  // `on_down(i)`: it went down (either way its cache is unknown).
  void start(double interval_s, std::function<void(int)> on_up, std::function<void(int)> on_down);

  int size() const { return int(specs_.size()); }
  const WorkerSpec& spec(int i) const { return specs_[size_t(i)]; }
  void mark_down(int i, const std::string& reason);
  // How often worker i went down so far: a request that sees it change
  // while awaiting the answer's head fails over (router_server.cpp).
  uint64_t downs(int i) const;
  std::vector<WorkerView> snapshot() const;
  void begin_request(int i);
  void end_request(int i);
  // Prometheus lines: up/down and load per worker.
  std::string metrics_text() const;

 private:
  struct State {
    bool up = false;
    std::string down_reason = "not checked yet";
    double waiting = 0, running = 0;
    double kv_total = 0, kv_free = 0, kv_used = 0, kv_cached = 0;
    int64_t inflight = 0;
    uint64_t downs = 0;
    std::string kv_listen;
    std::vector<std::string> decode_peers;
    std::vector<std::string> kv_listen_addrs;
    std::vector<std::vector<std::string>> decode_peer_addrs;
  };
  // What /health said about worker i's disaggregated role, its addresses
  // resolved: called without mu_ (name lookups block), then kept under it.
  State roles_of(int i, const ModelInfo& m) const;
  static void set_roles(State& s, State roles);
  // probe_all's end: the model of the first acceptable worker in `got`;
  // the others are up, or down with their reason in `why` (logged).
  void accept_first(const std::vector<std::optional<ModelInfo>>& got, std::vector<std::string>& why);
  // Why a worker that answered /health with `m` cannot be routed ("": it
  // can): another vocabulary or chat template than the router's, or
  // another model or block size than the workers accepted so far.
  std::string refusal(const ModelInfo& m) const;
  // The first half of refusal(): what the router's own -m and
  // --chat-template decide.
  std::string vocab_refusal(const ModelInfo& m) const;
  // One /health + /metrics round for worker i (health thread).
  void check(int i);
  void set_up(int i, bool up, const std::string& reason);

  std::vector<WorkerSpec> specs_;
  ModelInfo model_;
  std::string vocab_, model_file_;  // the router's -m
  std::string chat_, chat_desc_;    // the router's chat template
  mutable std::mutex mu_;
  std::vector<State> st_;
  std::function<void(int)> on_up_, on_down_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvs::router
