// Chat messages -> prompt text, for the common template families, written
// by hand (no Jinja engine). The family is detected from distinctive
// substrings of the GGUF's tokenizer.chat_template, or chosen with
// --chat-template. A template that is present but not recognised is an
// error at start-up (wrong prompts would be silent garbage); a model without
// any template gets the documented "plain" fallback ("role: content" lines).
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

// Family of a Jinja template text; nullopt when none matches.
std::optional<ChatFamily> detect_chat_family(const std::string& jinja);

// Picks the family at start-up. `option` is --chat-template ("auto" or a
// family name); `gguf_template` may be empty. `note` receives a line for
// stderr explaining the choice. Throws std::runtime_error on an unknown
// option or an unrecognised template under "auto".
ChatFamily choose_chat_family(const std::string& option, const std::string& gguf_template, std::string* note);

// The prompt text, ending with the opening of the assistant's turn. Special
// tokens appear as their text ("<|im_start|>"), so the caller encodes with
// parse_special = true. BOS is not included (the tokenizer adds it).
std::string render_chat(ChatFamily f, const std::vector<ChatMessage>& messages);

}  // namespace kvs::server
