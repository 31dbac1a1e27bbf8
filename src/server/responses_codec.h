// /v1/responses (OpenAI's Responses API) over the chat path: a request is
// translated into a chat completion (instructions as the system message,
// then the input items, after a previous response's conversation when
// previous_response_id names one) and its result rendered as a response
// object, or streamed as the Responses API's named events:
//   response.created, response.in_progress, response.output_item.added,
//   response.content_part.added, response.output_text.delta ...,
//   response.output_text.done, response.content_part.done,
//   response.output_item.done, then per function call output_item.added,
//   response.function_call_arguments.delta / .done, output_item.done, and
//   response.completed
// Every field is known or a 400 naming it, as for the other endpoints.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/openai_codec.h"

namespace kvs::server {

// The parts of a Responses request that a chat request does not have.
struct ResponsesRequest {
  std::string instructions;          // this request's only: not carried to a continuation
  std::string previous_response_id;  // "" = none
  bool store = true;                 // keep it for previous_response_id
  // This request's own input as chat messages (function_call items as an
  // assistant's tool_calls, function_call_output items as tool messages).
  nlohmann::ordered_json input = nlohmann::ordered_json::array();
  // temperature, top_p, max_output_tokens, text, metadata, tools,
  // tool_choice, parallel_tool_calls: echoed in the object.
  nlohmann::json params;
};

// The chat request the Responses body means (messages: instructions, then
// `history`, then the input), and the Responses-only parts in `out`.
// Throws ApiError naming the Responses field.
ParsedRequest parse_responses(const std::string& body, ResponsesRequest& out,
                              const nlohmann::ordered_json& history = nlohmann::ordered_json::array());
// previous_response_id alone (before the history is known).
std::string previous_response_id(const std::string& body);

// The complete response object.
// Output: the message item (the text), then one function_call item per call.
nlohmann::json response_object(const ResponseMeta& meta, const ResponsesRequest& rq, const std::string& text,
                               const std::vector<ToolCall>& calls, sched::FinishReason finish,
                               const sched::Usage& usage, bool done = true);
// The assistant turn a response adds to its conversation.
nlohmann::ordered_json assistant_turn(const std::string& text, const std::vector<ToolCall>& calls);

// The event stream of one response (n = 1), frame by frame.
class ResponsesEvents {
 public:
  ResponsesEvents(ResponseMeta meta, ResponsesRequest rq);
  std::string start();                         // created ... content_part.added
  std::string delta(const std::string& text);  // output_text.delta (nothing for "")
  // The done events, each call's item (added, arguments delta and done,
  // item done), then completed.
  std::string finish(sched::FinishReason finish, const sched::Usage& usage, const std::vector<ToolCall>& calls = {});
 private:
  std::string event(nlohmann::json e);
  ResponseMeta meta_;
  ResponsesRequest rq_;
  std::string text_, item_id_;
  int seq_ = 0;
};

}  // namespace kvs::server
