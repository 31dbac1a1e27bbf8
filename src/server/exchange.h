// One accepted completion request between submit() and the last byte of its
// response: it owns the event queue the engine pushes into, turns events into
// SSE chunks (stream) or one JSON object (not), and on destruction cancels
// the request if it is still running (client gone) and gives back the
// tenant's quota. It never touches a socket: the HTTP session polls it on its
// strand and writes what it returns.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sched/engine_loop.h"
#include "server/openai_codec.h"
#include "server/sse_stream.h"

namespace kvs {
class Tokenizer;
}

namespace kvs::server {

class TenantRegistry;
class ServerCounters;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra (Retry-After, ...)
};
// An OpenAI error object as a response (Retry-After when e.retry_after_s > 0).
HttpResponse error_response(const ApiError& e);
// 500 for a request the engine failed while running it (FinishReason::Error).
ApiError engine_failure(const std::string& message);
// The error for a request the engine loop rejected.
ApiError reject_error(sched::RejectReason r, const std::string& message, double retry_after_s);

class Exchange {
 public:
  struct Setup {
    sched::EngineLoop* loop = nullptr;
    const Tokenizer* tok = nullptr;
    TenantRegistry* tenants = nullptr;
    ServerCounters* counters = nullptr;
    Endpoint endpoint = Endpoint::Completions;
    bool stream = false, include_usage = false, logprobs = false;
    int n = 1;
    ResponseMeta meta;
    std::string tenant;        // quota key in the registry
    int64_t quota_blocks = 0;  // reserved in the registry; released by the destructor
    std::string log_prefix;    // "id=... tenant=<hash> prefix=<hash>" (no text)
    size_t queue_events = 4096;
  };
  explicit Exchange(Setup s);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  std::shared_ptr<EventQueue> queue() const { return queue_; }
  void set_request_id(sched::RequestId id) { id_ = id; }
  bool streaming() const { return s_.stream; }

  struct Output {
    std::optional<HttpResponse> full;  // a whole response (non-streaming result, or an error before streaming)
    bool start_stream = false;         // send the SSE response head now (first time only)
    std::string data;                  // SSE bytes to send (after the head)
    bool done = false;                 // nothing more will come
    bool cut_off = false;              // the client could not keep up: close the connection
  };
  // On the session's strand, after a wake-up: drains the queue.
  Output poll();
  // The client went away (read EOF/reset or write failure): cancel now.
  void client_gone();
  // For the access log: the HTTP status that was sent.
  void set_final_status(int status) { final_status_ = status; }

 private:
  struct Choice {
    bool first = true, done = false;
    ChoiceResult result;
  };
  Setup s_;
  std::shared_ptr<EventQueue> queue_;
  sched::RequestId id_ = 0;
  std::vector<Choice> choices_;
  int open_;
  sched::Usage usage_;
  bool started_ = false, finished_ = false, gone_ = false;
  std::string engine_error_;  // set when a choice ended with FinishReason::Error
  int final_status_ = 0;
  double t0_, t_first_ = -1;
};

}  // namespace kvs::server
