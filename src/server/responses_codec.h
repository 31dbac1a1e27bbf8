// /v1/responses (OpenAI's Responses API) over the chat path: a request is
// translated into a chat completion (instructions as the system message,
// then the input items, after a previous response's conversation when
// previous_response_id names one) and its result rendered as a response
// object, or streamed as the Responses API's named events:
//   response.created, response.in_progress, response.output_item.added,
//   response.content_part.added, response.output_text.delta ...,
//   response.output_text.done, response.content_part.done,
//   response.output_item.done, response.completed
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
  std::vector<ChatMessage> input;    // this request's own messages
  nlohmann::json params;             // temperature, top_p, max_output_tokens, text, metadata: echoed in the object
};

// The chat request the Responses body means (messages: instructions, then
// `history`, then the input), and the Responses-only parts in `out`.
// Throws ApiError naming the Responses field.
ParsedRequest parse_responses(const std::string& body, ResponsesRequest& out,
                              const std::vector<ChatMessage>& history = {});
// previous_response_id alone (before the history is known).
std::string previous_response_id(const std::string& body);

// The complete response object.
nlohmann::json response_object(const ResponseMeta& meta, const ResponsesRequest& rq, const std::string& text,
                               sched::FinishReason finish, const sched::Usage& usage, bool done = true);

// The event stream of one response (n = 1), frame by frame.
class ResponsesEvents {
 public:
  ResponsesEvents(ResponseMeta meta, ResponsesRequest rq);
  std::string start();                         // created ... content_part.added
  std::string delta(const std::string& text);  // output_text.delta (nothing for "")
  std::string finish(sched::FinishReason finish, const sched::Usage& usage);  // the done events, completed
 private:
  std::string event(nlohmann::json e);
  ResponseMeta meta_;
  ResponsesRequest rq_;
  std::string text_, item_id_;
  int seq_ = 0;
};

}  // namespace kvs::server
