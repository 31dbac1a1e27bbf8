// One accepted completion request between submit() and the last byte of its
// response: it owns the event queue the engine pushes into, turns events into
// SSE chunks (stream) or one JSON object (not), and on destruction cancels
// whatever still runs (client gone, or a sibling failed) and gives back the
// tenant's quota. A request with several prompts is one engine Request per
// prompt, all feeding this one queue with their choices renumbered
// prompt-major (prompt i, choice j -> i * n + j). It never touches a socket:
// the HTTP session polls it on its strand and writes what it returns.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sched/engine_loop.h"
#include "server/logprob_hold.h"
#include "server/openai_codec.h"
#include "server/responses_codec.h"
#include "server/response_stream.h"
#include "server/sse_stream.h"

namespace kvs {
class Tokenizer;
}

namespace kvs::server {

class TenantRegistry;
class ServerCounters;

// An OpenAI error object as a response (Retry-After when e.retry_after_s > 0).
HttpResponse error_response(const ApiError& e);
// A JSON body with this status.
HttpResponse json_response(int status, const nlohmann::json& j);
ApiError make_error(int status, const std::string& type, const std::string& code, const std::string& msg);
// 401 for a missing or unknown API key.
ApiError unauthorized();
// 500 for a request the engine failed while running it (FinishReason::Error).
ApiError engine_failure(const std::string& message);
// The error for a request the engine loop rejected.
ApiError reject_error(sched::RejectReason r, const std::string& message, double retry_after_s,
                      const std::string& param = {});

class Exchange final : public ResponseStream {
 public:
  struct Setup {
    sched::EngineLoop* loop = nullptr;
    const Tokenizer* tok = nullptr;
    TenantRegistry* tenants = nullptr;
    ServerCounters* counters = nullptr;
    Endpoint endpoint = Endpoint::Completions;
    bool stream = false, include_usage = false, logprobs = false;
    bool continuous_usage = false;   // stream_options.continuous_usage_stats: usage so far in every chunk
    int n = 1;                       // choices per prompt
    int prompts = 1;                 // engine requests (completions with several prompts)
    std::vector<std::string> echo;   // per prompt: text that starts each of its choices (echo), or empty
    int prompt_tokens = 0;           // all prompts together (the access log, even when no final event came)
    ResponseMeta meta;
    std::string tenant;        // quota key in the registry
    int64_t quota_blocks = 0;  // reserved in the registry; released by the destructor
    std::string log_prefix;    // "id=... tenant=<hash> prefix=<hash>" (no text)
    size_t queue_events = 4096;
    std::function<void(const std::string&)> log;  // the access-log line (default: stderr)
    bool hand_off = false;     // prefill worker: answered with the hand-over, not text
    uint64_t seed = 0;         // the sampling seed (a hand-over passes it on)
    // Decode worker: the wait on the hand-over this request claims, dropped
    // with the exchange (ApiOptions::await_handover).
    std::shared_ptr<void> handover_hold;
    // Endpoint::Responses: its own fields, and what to do with the response
    // object and its output once complete (keep them for
    // previous_response_id and GET /v1/responses/{id}).
    std::shared_ptr<const ResponsesRequest> responses;
    std::function<void(const nlohmann::json& response, const std::string& text, const std::vector<ToolCall>& calls)>
        on_done;
    // Chat with tools: calls are parsed out of each choice's text in this
    // format (None: plain text).
    ToolFormat tool_format = ToolFormat::None;
  };
  explicit Exchange(Setup s);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  std::shared_ptr<EventQueue> queue() const { return queue_; }
  // The engine id of prompt `prompt`'s request (in submit order).
  void set_request_id(int prompt, sched::RequestId id) { prompts_.at(size_t(prompt)).id = id; }
  // The sink for prompt `prompt`'s engine request: renumbers its choices.
  sched::EventSink sink_for(int prompt) const;
  bool streaming() const { return s_.stream; }

  using Output = StreamOutput;
  // On the session's strand, after a wake-up: drains the queue.
  Output poll() override;
  // The client went away (read EOF/reset or write failure): cancel now.
  void client_gone() override;
  // For the access log: the HTTP status that was sent.
  void set_final_status(int status) { final_status_ = status; }

 private:
  struct Choice {
    bool first = true, done = false;
    ChoiceResult result;
    TextOffsets offsets;                    // streamed completions logprobs: text_offset across chunks
    LogprobHold held;                       // logprobs wait for their text
    std::unique_ptr<ToolCallParser> tools;  // Setup::tool_format
  };
  // The event's text through the choice's tool-call parser (its calls and
  // reasoning in `out`, the rest left as the event's text).
  void parse_tools(Choice& c, sched::TokenEvent& e, ToolParse& out);
  struct Prompt {
    sched::RequestId id = 0;
    int open = 0;             // choices not finished
    int tokens_seen = 0;      // completion tokens taken from the queue
    sched::Usage usage;       // of the latest final event (covers its choices so far)
  };
  // False when the event ended the whole exchange (a rejection before any byte was sent).
  bool take_event(sched::TokenEvent& e, Output& out);
  // `lps`: the logprobs released with this event (LogprobHold).
  std::string chunk_of(Choice& c, sched::TokenEvent& e, const std::vector<LogprobEntry>& lps);
  void collect(Choice& c, sched::TokenEvent& e, const std::vector<LogprobEntry>& lps);
  TokenText token_text() const;
  void finish(Output& out);
  void finish_response(Output& out, const sched::Usage& usage);
  // A streamed chunk's "usage": null, or (continuous_usage) the counts so far.
  nlohmann::json chunk_usage() const;
  sched::Usage total_usage() const;
  void cancel_open();
  void log_line();

  Setup s_;
  std::shared_ptr<EventQueue> queue_;
  std::vector<Prompt> prompts_;
  std::vector<Choice> choices_;
  int open_;
  bool started_ = false, finished_ = false, gone_ = false;
  std::string engine_error_;  // set when a choice ended with FinishReason::Error
  int final_status_ = 0;
  double t0_, t_first_ = -1;
  std::optional<sched::HandOff> handed_;  // the prefill worker's hand-over
  std::unique_ptr<ResponsesEvents> events_;  // Endpoint::Responses, streamed
};

}  // namespace kvs::server
