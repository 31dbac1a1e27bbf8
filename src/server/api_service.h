// The HTTP API without the sockets: routes a parsed HTTP request to
// /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics or
// /admin/tenants/{id}/revoke. Completion requests are authenticated, parsed,
// tokenized, checked against the context and the tenant's quota and
// submitted to the engine loop, all on the calling (HTTP) thread and without
// waiting for the engine; what comes back is either a whole response or an
// Exchange that the session polls as events arrive.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sched/engine_loop.h"
#include "server/chat_template.h"
#include "server/dashboard.h"
#include "server/dashboard_hub.h"
#include "server/exchange.h"
#include "server/response_store.h"
#include "server/metrics_text.h"
#include "server/tenants.h"

namespace kvs {
class Tokenizer;
}

namespace kvs::server {

struct ApiOptions {
  std::string model_id;                   // the name clients send as "model" (and /v1/models lists)
  std::vector<std::string> model_aliases; // also accepted (file name, path)
  std::string model_identity;             // Model::identity(): part of every cache scope
  int ctx = 0;                            // context window (prompt + completion), tokens
  int default_max_tokens = 256;           // when a request names none (capped by the context)
  ChatTemplate chat = ChatTemplate::fixed(ChatFamily::Plain);
  size_t stream_queue_events = 4096;      // per-request engine -> socket bound
  int64_t model_created = 0;              // /v1/models "created": unix seconds (the model file's mtime)
  bool metrics_vllm = true;               // --metrics-compat vllm: vllm:* names in /metrics too
  // More Prometheus text appended to /metrics (e.g. the KV-event publisher's
  // counters); empty = none.
  std::function<std::string()> extra_metrics;
  // Request log lines (accepted and rejected; hashes and counts, never
  // text). Default: stderr.
  std::function<void(const std::string&)> log;
  // GET /dashboard and its event stream (admin key only with --api-keys).
  bool dashboard = true;
  double dashboard_period_s = 1.0;
  DashboardOptions dashboard_opts;
  std::string plots_dir;  // SVG plots linked from the dashboard; empty = none
  // Disaggregated serving (docs/DISAGG.md). Prefill worker: every
  // completion runs to its first token, is submitted with the sink this
  // returns (which ships its K/V to the decode worker) and is answered with
  // the hand-over as JSON instead of text.
  // The int is a decode peer's index (decode_peer_index).
  std::function<sched::EventSink(sched::EventSink, const Scope&, int)> hand_off_sink;
  // Prefill worker: the index of decode peer HOST:PORT, -1 if not one.
  std::function<int(const std::string&)> decode_peer_index;
  // Fields added to /health (the disaggregated role and its addresses).
  nlohmann::json health_extra = nlohmann::json::object();
  // Decode worker: a completion posted with ?kv_handover=HANDLE.TOKEN.DRAWS.SEED
  // continues the handed-over request instead of prefilling.
  bool accept_handover = false;
  // Decode worker: a request for hand-over `handle` arrived; the result is
  // held until the request ends (disagg/decode_endpoint.h, await_claim).
  std::function<std::shared_ptr<void>(uint64_t handle)> await_handover;
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path (and query)
  std::string authorization;
  std::string body;
};

struct Routed {
  HttpResponse response;               // used when exchange is null
  std::shared_ptr<Exchange> exchange;  // an accepted completion request
  std::shared_ptr<ResponseStream> stream;  // another long response (the dashboard's events)
};

class ApiService {
 public:
  ApiService(sched::EngineLoop& loop, const Tokenizer& tok, TenantRegistry& tenants, ApiOptions opts);

  // `wake` is handed to the request's event queue: it runs on the engine
  // thread and must only post work to the caller's strand.
  Routed handle(const HttpRequest& req, std::function<void()> wake);

  void set_ready(bool on) { ready_ = on; }
  // Draining also ends the dashboard's event streams (they never end by
  // themselves).
  void set_draining(bool on);
  bool draining() const { return draining_; }
  ServerCounters& counters() { return counters_; }
  const ApiOptions& options() const { return opts_; }

 private:
  // A validated request, tokenized: one engine prompt per completions prompt.
  struct Prepared {
    ParsedRequest p;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int> max_tokens;         // per prompt
    std::vector<std::string> echo;       // per prompt, when echo
    int prompt_tokens = 0;
    int64_t need_blocks = 0;             // worst case of all prompts' choices
    int decode_peer = 0;                 // prefill worker: ?kv_decode_peer=, as an index
    std::shared_ptr<const ResponsesRequest> responses;  // /v1/responses
    Conversation history = Conversation::array();  // /v1/responses: the conversation previous_response_id names
  };
  Routed completions(Endpoint ep, const HttpRequest& req, std::function<void()> wake);
  Prepared prepare(Endpoint ep, const HttpRequest& req, const Caller& caller);  // throws ApiError
  void prepare_tools(ParsedRequest& p) const;
  // A hand-over named by the request target (decode worker), its seed.
  struct HandoverQuery {
    sched::Handover h;
    uint64_t seed = 0;
  };
  std::optional<HandoverQuery> handover_query(const std::string& target) const;  // throws ApiError
  // ?kv_decode_peer=HOST:PORT (prefill worker): which of its decode peers
  // gets the blocks; 0 (the first) when absent. Throws ApiError.
  int decode_peer_query(const std::string& target) const;
  Routed submit(Endpoint ep, Prepared&& pr, const Caller& caller, int64_t reserved, std::function<void()> wake,
                const std::optional<HandoverQuery>& hq);
  HttpResponse revoke(const HttpRequest& req, const std::string& tenant);
  // /v1/models, or /v1/models/{id} (the SDK's models.retrieve) when `id` is set.
  HttpResponse models(const HttpRequest& req, const std::optional<std::string>& id = std::nullopt) const;
  // GET or DELETE /v1/responses/{id}: a response the caller's tenant stored.
  HttpResponse stored_response(const HttpRequest& req, const std::string& id);
  // /tokenize, /detokenize, /apply-template (server/token_endpoints.h).
  HttpResponse token_tools(const HttpRequest& req, const std::string& path) const;
  // /dashboard, /dashboard/events, /dashboard/snapshot, /dashboard/plots/*
  Routed dashboard(const HttpRequest& req, const std::string& path, std::function<void()> wake);
  // Counts and logs a request the server turned away itself.
  HttpResponse fail(const ApiError& e, const std::string& tenant_hash);
  void log(const std::string& line) const;

  sched::EngineLoop& loop_;
  const Tokenizer& tok_;
  TenantRegistry& tenants_;
  ApiOptions opts_;
  ServerCounters counters_;
  ResponseStore responses_;  // /v1/responses kept for previous_response_id
  std::atomic<bool> ready_{false}, draining_{false};
  std::atomic<uint64_t> next_id_{1};
  std::string id_salt_;
  std::string fingerprint_;  // system_fingerprint: the model identity, shortened
  std::unique_ptr<ServeDashboard> dash_;
  std::unique_ptr<DashboardHub> hub_;  // after dash_: stops before it goes
};

}  // namespace kvs::server
