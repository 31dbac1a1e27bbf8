// Chat messages -> prompt text for five template families written by hand:
// the fallback for a model file without a chat template ("plain": "role:
// content" lines) and what --chat-template NAME picks. A model's own
// template is rendered by the Jinja engine instead (chat_template.h).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace kvs::server {

enum class ChatFamily { Llama2, Llama3, ChatML, Mistral, Plain };

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" (others are rendered as given)
  std::string content;
};

const char* to_string(ChatFamily f);  // "llama2", "llama3", "chatml", "mistral", "plain"
std::optional<ChatFamily> parse_chat_family(const std::string& name);

// The prompt text, ending with the opening of the assistant's turn. Special
// tokens appear as their text ("<|im_start|>"), so the caller encodes with
// parse_special = true. BOS is not included (the tokenizer adds it).
// add_generation_prompt false leaves out the assistant turn's opening
// (Llama 2 and Mistral have none apart from the last [/INST]).
std::string render_chat(ChatFamily f, const std::vector<ChatMessage>& messages, bool add_generation_prompt = true);

}  // namespace kvs::server
