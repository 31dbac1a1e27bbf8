// A chat request's prompt text: its messages (and chat_template_kwargs)
// through the chat template, as /v1/chat/completions, /apply-template and
// the router's request hasher all make it.
#pragma once
#include <string>

#include "server/chat_template.h"
#include "server/openai_codec.h"

namespace kvs::server {

ChatInputs chat_inputs(const ParsedRequest& p, bool add_generation_prompt = true);
// The text the tokenizer takes (ChatTemplate::render). A template that
// cannot render these messages is an ApiError 400 with param "messages".
// add_generation_prompt false (/apply-template only) leaves out the
// assistant turn's opening.
std::string chat_prompt(const ChatTemplate& t, const ParsedRequest& p, bool add_generation_prompt = true);

}  // namespace kvs::server
