#include "server/chat_prompt.h"

namespace kvs::server {

ChatInputs chat_inputs(const ParsedRequest& p, bool add_generation_prompt) {
  ChatInputs in;
  in.add_generation_prompt = add_generation_prompt;
  in.messages = p.chat_messages;  // the template adapts them (ChatTemplate)
  if (p.tools.active()) in.tools = p.tools.tools;
  in.extra = p.chat_template_kwargs;
  return in;
}

std::string chat_prompt(const ChatTemplate& t, const ParsedRequest& p, bool add_generation_prompt) {
  try {
    return t.render(chat_inputs(p, add_generation_prompt));
  } catch (const ChatTemplateError& e) {
    ApiError err = bad_request(std::string("the chat template cannot render these messages: ") + e.what(), "messages");
    err.code = "chat_template_error";
    throw err;
  }
}

}  // namespace kvs::server
