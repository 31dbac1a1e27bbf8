// OpenAI JSON <-> the engine loop's plain data: request bodies of
// /v1/completions and /v1/chat/completions in, response objects, stream
// chunks and error objects out. No sockets, no model: pure functions that
// the HTTP layer calls and tests can call directly.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "grammar/grammar.h"
#include "sched/request.h"
#include "server/chat_family.h"
#include "server/tool_request.h"

namespace kvs::server {

// An error with its HTTP status, in OpenAI's shape:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;     // "" -> null
  std::string message;  // one line; never echoes prompt text
  std::string param;    // "" -> null
  double retry_after_s = 0;  // > 0: Retry-After header (429)
};
std::string error_body(const ApiError& e);
ApiError bad_request(const std::string& message, const std::string& param = {});

// Responses (/v1/responses) is parsed and rendered by responses_codec.h;
// the rest of the path treats it as a chat request.
enum class Endpoint { Completions, Chat, Responses };

// One completions prompt: text, or token ids fed verbatim (no BOS added).
struct PromptInput {
  std::string text;
  std::optional<std::vector<int32_t>> ids;
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;                          // "" when absent (the served model is meant)
  std::vector<PromptInput> prompts;           // completions: one or more (each gets n choices)
  bool echo = false;                          // completions: the prompt text starts each choice's text
  std::vector<ChatMessage> messages;          // chat: role and text
  // chat: the messages as sent (every field, the client's key order; the
  // "developer" role as "system"), and chat_template_kwargs, for the template.
  nlohmann::ordered_json chat_messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  ToolRequest tools;                          // chat: tools, tool_choice, parallel_tool_calls
  std::optional<int> max_tokens;
  SamplingParams sampling;
  bool seeded = false;                        // "seed" given (else the server draws one)
  std::vector<std::string> stop;
  int n = 1;
  bool stream = false;
  bool include_usage = false;                 // stream_options.include_usage
  bool continuous_usage = false;              // stream_options.continuous_usage_stats (vLLM): usage in every chunk
  bool logprobs = false;
  int top_logprobs = 0;
  bool ignore_eos = false;
  int min_tokens = 0;                         // vLLM's min_tokens
  std::vector<int32_t> stop_token_ids;        // vLLM's stop_token_ids
  // response_format json_object / json_schema, or llama-server's "grammar"
  // (GBNF), compiled; null for free text.
  std::shared_ptr<const grammar::Grammar> grammar;
  std::optional<sched::SloClass> slo;         // "priority" / "slo_class"
};

// Limits on fields (beyond the HTTP body limit).
inline constexpr int kMaxChoices = 16;          // n
inline constexpr int kMaxPrompts = 64;          // prompts in one completions request
inline constexpr int kMaxTotalChoices = 64;     // prompts x n
inline constexpr int kMaxStops = 16;
inline constexpr size_t kMaxStopBytes = 256;
inline constexpr int kMaxTopLogprobs = 20;

// Parses and validates a request body; throws ApiError (400) naming the
// field. An unknown field, or a known one kvserve does not implement, is a
// 400 naming it (server/request_fields.h); a field of the wrong type is an
// error; null counts as absent. `n_vocab` > 0: token ids in logit_bias and
// stop_token_ids must be below it (0: left to the scheduler, whose reject
// cannot name the field).
ParsedRequest parse_request(Endpoint ep, const std::string& body, int64_t n_vocab = 0);

// What one choice produced, for the non-streaming response.
struct ChoiceResult {
  std::string text;
  sched::FinishReason finish = sched::FinishReason::None;
  std::vector<sched::TokenLogprob> logprobs;               // one per token, when asked
  std::vector<std::vector<sched::TokenLogprob>> top_logprobs;
  std::vector<sched::PromptLogprob> prompt_logprobs;       // echo with logprobs: the prompt's tokens first
  size_t echo_bytes = 0;                                   // echo: text's first echo_bytes are the prompt's text
  std::vector<ToolCall> tool_calls;                        // chat with tools: the calls, in order
  std::string reasoning;                                   // chat with tools: harmony's analysis channel
};

// Chat with tools, for one streamed chunk: what the tool-call parser took
// out of the event's text.
struct ChatExtras {
  ToolParse parsed;        // its calls and reasoning (content stays the event's text)
  int first_call = 0;      // the tool_calls index of parsed.calls[0]
  bool tool_finish = false;  // a call was made: a "stop" finish is "tool_calls"
};

// Token id -> its text (bytes; may be a partial UTF-8 character).
using TokenText = std::function<std::string(int32_t)>;

// One generated token's logprob and its alternatives (best first).
struct LogprobEntry {
  sched::TokenLogprob token;
  std::vector<sched::TokenLogprob> top;
};

struct ResponseMeta {
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string system_fingerprint;  // "" -> omitted
};

const char* finish_reason_name(sched::FinishReason f);  // "stop", "length", "abort", "error"
nlohmann::json usage_json(const sched::Usage& u);

// The complete response of a non-streaming request; a choice's "index" is
// its position in `choices` (prompt-major: prompt i, choice j -> i * n + j).
nlohmann::json completion_response(Endpoint ep, const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                                   const sched::Usage& usage, bool logprobs, const TokenText& token_text);

// Completions logprobs of one streamed choice: text_offset counts from the
// start of the choice's whole text, as without streaming, so the count runs
// on across its chunks.
struct TextOffsets {
  int64_t next = 0;       // where the next token's text starts
  std::string echo;       // echo: the prompt's text, which leads the first chunk's text
};

// One streamed chunk for an event of choice `e.choice` (text and/or finish).
// `first` marks the choice's first chunk (chat: carries the role). Returns
// null JSON when the event has nothing to say (no text, no logprob, not final).
// `offsets`: the choice's running text offsets (null: this chunk alone).
// `logprobs`: null when not asked for, else the tokens to list in this chunk
// (those whose text it or an earlier chunk carries: LogprobHold).
nlohmann::json stream_chunk(Endpoint ep, const ResponseMeta& meta, const sched::TokenEvent& e, bool first,
                            const std::vector<LogprobEntry>* logprobs, const TokenText& token_text,
                            const ChatExtras* extras = nullptr, TextOffsets* offsets = nullptr);
// The usage-only chunk sent before [DONE] when stream_options.include_usage.
nlohmann::json usage_chunk(Endpoint ep, const ResponseMeta& meta, const sched::Usage& u);

// JSON text for the wire: invalid UTF-8 (split characters in logprob tokens)
// becomes U+FFFD instead of an exception.
std::string dump(const nlohmann::json& j);

}  // namespace kvs::server
