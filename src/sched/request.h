// What a client asks the engine loop for, and what comes back: plain data
// shared by the scheduler, the engine loop and the HTTP server. Nothing here
// touches the model or the KV pool.
//
//   Request      -> EngineLoop::submit  -> SubmitResult (accepted, or rejected
//                                          with a reason and a Retry-After)
//   TokenEvent*  <- the request's EventSink, from the engine thread; the last
//                   event of each choice has finish != None and the usage.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "grammar/grammar.h"
#include "kv/prefix_hash.h"

namespace kvs::sched {

// Two service classes. Interactive requests have a tight time-to-first-token
// target, a share of the pool held back for them and queue priority; batch
// requests fill what is left, are preempted first and age (a batch request
// that waited long enough is ordered like an interactive one).
enum class SloClass : uint8_t { Interactive = 0, Batch = 1 };
inline constexpr int kNumSloClasses = 2;
const char* to_string(SloClass c);                        // "interactive" / "batch"
std::optional<SloClass> parse_slo_class(const std::string& s);  // the names above

// Unique among live requests; 0 in a Request means "assign one" (the
// SubmitResult names it).
using RequestId = uint64_t;

struct TokenEvent;
// Receives a request's events on the engine thread. Must not block: return
// false when the consumer cannot take the event (queue full, client gone) and
// the request is cancelled (its blocks are freed at once). The final event of
// every choice is delivered even then (the return value is ignored).
using EventSink = std::function<bool(TokenEvent&&)>;

// Disaggregated serving. A prefill worker's request with hand_off set stops
// after sampling its first token: its sequence is not released but handed to
// the caller (TokenEvent::hand_off) to ship to a decode worker. The decode
// worker's request carries the Handover: it claims the adopted sequence
// instead of prefilling, and continues from the first token with the
// sampler advanced past the prefill side's draws.
struct Handover {
  uint64_t handle = 0;         // the KV transfer's adoption handle
  int32_t first_token = -1;
  uint64_t draws = 0;          // random draws the prefill side's sampler made
};

struct Request {
  RequestId id = 0;
  std::vector<int32_t> prompt;        // token ids fed to the model (BOS included); not empty
  SamplingParams sampling;            // temperature <= 0: greedy; seed: choice i uses seed + i
  std::optional<int> max_tokens;      // hard stop; nullopt = the loop's default cap
  std::vector<std::string> stop;      // stop strings (not part of the text)
  bool ignore_eos = false;
  // End-of-generation tokens (and stop_token_ids) cannot be drawn before a
  // choice has this many tokens; stop strings do not end it before either.
  int min_tokens = 0;
  // Drawing one of these ends the choice like EOS (finish "stop", the token
  // not emitted); ignore_eos does not lift them.
  std::vector<int32_t> stop_token_ids;
  int n = 1;                          // choices; n > 1 forks share the prompt's blocks
  SloClass slo = SloClass::Interactive;
  std::string tenant;                 // quota key (hashed in logs)
  Scope scope;                        // prefix-cache scope, derived by the server (tenant, permissions)
  double retention_s = 0;             // > 0: cached blocks of `scope` unused this long are dropped
  bool logprobs = false;              // log-probability of each sampled token
  int top_logprobs = 0;               // and the most likely alternatives (0..20)
  // The log-probability of every prompt token after the first (and its
  // top_logprobs alternatives), on each choice's first event: the prompt is
  // computed whole, without prefix-cache hits (OpenAI's echo + logprobs).
  bool prompt_logprobs = false;
  // Constrained decoding (a JSON schema, json_object, or GBNF): every
  // choice's text is a prefix of a sentence of this grammar, and ends only
  // where the grammar may end (finish "stop").
  std::shared_ptr<const grammar::Grammar> grammar;
  // Control tokens' own text in the event text (a tool-call parser reads
  // the markers); end-of-generation tokens still end a choice unseen.
  bool special_text = false;
  EventSink sink;                     // may be empty (events dropped; tests, benchmarks)
  bool hand_off = false;              // prefill worker: stop after the first token, hand the sequence over (n == 1)
  std::optional<Handover> handover;   // decode worker: continue a handed-over sequence (n == 1)
};

// Why a request did not run (or stopped early). Stable names: the server
// puts them in the 429 body and the metrics label.
enum class RejectReason : uint8_t {
  None = 0,
  Invalid,         // bad field (empty prompt, token out of range, n < 1, ...): HTTP 400
  ContextLength,   // prompt + max_tokens exceeds the context window: HTTP 400
  RequestShare,    // worst-case blocks exceed --max-request-share of the pool
  TenantQuota,     // the tenant's reserved + queued blocks would exceed its quota
  QueueFull,       // --max-queue requests already waiting
  QueueTimeout,    // not admitted within its class's wait limit
  ShuttingDown,    // drain()/shutdown() in progress
  DecodeNoRoom,    // prefill worker: the decode worker had no free KV blocks for the hand-over
  DeviceBusy,      // the device is critical (memory, heat): no new admissions (ShedLimits)
};
inline constexpr int kNumRejectReasons = 10;
const char* to_string(RejectReason r);  // "invalid", "context_length", "request_share", ...
// True for reasons that a retry later may cure (HTTP 429 with Retry-After);
// false for Invalid/ContextLength/RequestShare (HTTP 400: the request itself is too big).
bool retryable(RejectReason r);

// One request turned away, for the dashboard's demand signal: what it would
// have needed (worst case, blocks) and why it did not get it. No text.
struct RejectRecord {
  double t = 0;  // the scheduler's clock
  RejectReason reason = RejectReason::None;
  SloClass slo = SloClass::Interactive;
  std::string tenant;  // the quota key (the server passes a hash)
  int64_t need_blocks = 0;
};

struct SubmitResult {
  bool accepted = false;
  RequestId id = 0;               // the request's id (assigned when the Request had 0)
  RejectReason reason = RejectReason::None;
  std::string message;            // one line for the client; never the prompt text
  std::string param;              // Invalid: the request field at fault ("" when none is)
  double retry_after_s = 0;       // > 0 for retryable rejections: estimate from the drain rate
  int64_t need_blocks = 0;        // worst-case blocks the request would reserve (undiscounted)
};

enum class FinishReason : uint8_t {
  None = 0,    // not finished (a token event)
  Stop,        // EOS / end-of-turn token or a stop string
  Length,      // max_tokens reached (or the context window)
  Cancelled,   // cancel(), client disconnect, or the sink refused an event
  Rejected,    // left the queue without running (QueueTimeout, ShuttingDown): see reject_reason
  Error,       // internal failure confined to this request (message says what)
  HandedOff,   // Request::hand_off: prefilled and first token sampled; see TokenEvent::hand_off
};
const char* to_string(FinishReason f);  // "stop", "length", "cancelled", "rejected", "error"

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;  // natural log of the softmax of the raw logits
};

// One prompt position: token = prompt[position] and its log-probability
// given prompt[0, position) (none for position 0).
struct PromptLogprob {
  int position = 0;
  int32_t token = -1;
  std::optional<float> logprob;
  std::vector<TokenLogprob> top;
};

struct Usage {
  int prompt_tokens = 0;      // len(prompt)
  int completion_tokens = 0;  // generated tokens over all choices
  int cached_tokens = 0;      // prompt tokens whose K/V came from the prefix cache (first admission)
  int tier_tokens = 0;        // of cached_tokens, loaded from a lower KV tier (disk, Redis)
  double tier_load_ms = -1;   // time the tier took to stage them (-1: no tier fetch)
};

// With FinishReason::HandedOff: the sequence now belongs to whoever holds
// the event (EngineLoop::release_held when done with it), who ships it and
// fills in the transfer's outcome (handle onwards).
struct HandOff {
  int64_t seq = -1;             // a SeqId of the prefill worker's pool
  int32_t first_token = -1;
  uint64_t draws = 0;           // random draws its sampler made
  uint64_t handle = 0;          // the decode worker's adoption handle
  int64_t blocks = 0, skipped_blocks = 0, bytes = 0;
  double seconds = 0;           // offer to the decode worker's result
};

struct TokenEvent {
  RequestId request = 0;
  int choice = 0;             // 0 .. n-1
  int32_t token = -1;         // -1 on a final event that carries no token
  std::string text;           // newly final text (complete UTF-8, stop strings held back); may be ""
  std::optional<TokenLogprob> logprob;        // when Request::logprobs
  std::vector<TokenLogprob> top_logprobs;     // when Request::top_logprobs > 0, best first
  FinishReason finish = FinishReason::None;   // set on the choice's last event
  RejectReason reject_reason = RejectReason::None;  // with FinishReason::Rejected
  std::string message;        // with Rejected / Error
  double retry_after_s = 0;   // with Rejected
  Usage usage;                // on final events (whole request, all choices so far)
  std::optional<HandOff> hand_off;  // with FinishReason::HandedOff
  // Request::prompt_logprobs: positions 0 .. len(prompt) - 1, on each
  // choice's first event.
  std::vector<PromptLogprob> prompt_logprobs;
};

}  // namespace kvs::sched
