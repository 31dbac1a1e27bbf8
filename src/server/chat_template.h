// The chat template: chat messages -> the prompt text the model was trained
// on. Normally the model's own Jinja template (the GGUF's
// tokenizer.chat_template), rendered by src/jinja as Hugging Face
// transformers renders it; a hand-written family (chat_family.h) for a
// model file without one, or when --chat-template names one. The server's
// chat endpoint, /apply-template, the router's request hasher and
// `kvserve chat` all render through this, so they agree on every prompt.
#pragma once
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "server/chat_family.h"
#include "server/tool_calls.h"

namespace kvs {
struct Vocab;
}
namespace kvs::jinja {
class Template;
}

namespace kvs::server {

// What one render takes besides the template, as OpenAI requests carry it.
struct ChatInputs {
  // Messages in OpenAI's shape, every field kept (role, content as a string
  // or text parts, tool_calls, tool_call_id, name, reasoning_content, ...).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;  // OpenAI tool definitions; null = none
  bool add_generation_prompt = true;
  // More template variables (enable_thinking, reasoning_effort, ...).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

// A template that does not parse (at start-up) or cannot render the given
// messages (a type error, raise_exception, a limit); the message names the
// template's line.
class ChatTemplateError : public std::runtime_error {
 public:
  ChatTemplateError(const std::string& message, bool raised) : std::runtime_error(message), raised_(raised) {}
  bool raised() const { return raised_; }  // the template's own raise_exception

 private:
  bool raised_;
};

class ChatTemplate {
 public:
  // A hand-written family; it ignores tools and extra variables.
  static ChatTemplate fixed(ChatFamily f);
  // A Jinja template; `vocab` gives bos_token / eos_token and whether the
  // tokenizer adds them itself. `name` names it in error messages. Throws
  // ChatTemplateError when it does not parse.
  static ChatTemplate jinja(const std::string& source, const std::string& name, const Vocab& vocab);
  // The start-up choice. `option` is --chat-template: "auto" (the model's
  // template, else the plain fallback), a family name, the name of a
  // variant the model file carries (tokenizer.chat_template.NAME), or a
  // file of Jinja. `note` receives a line for stderr. Throws
  // std::runtime_error for an option that is none of these or a template
  // that does not parse.
  static ChatTemplate choose(const std::string& option, const Vocab& vocab, std::string* note);

  // The prompt text for the tokenizer: the template's output, less a
  // leading BOS text when the tokenizer adds BOS itself (and a trailing EOS
  // text when it adds EOS), as llama.cpp does, so that the prompt never
  // starts with two BOS tokens. Throws ChatTemplateError.
  std::string render(const ChatInputs& in) const;
  // The template's output exactly as Jinja2 would give it.
  std::string render_raw(const ChatInputs& in) const;

  // "chat-v1:" + SHA-256 hex of what decides the rendered text (the family,
  // or the Jinja source): a worker reports it in /health and a router
  // compares it with its own, since it hashes chat prompts itself.
  const std::string& fingerprint() const { return fingerprint_; }
  // Set for a hand-written family, empty for a Jinja template.
  std::optional<ChatFamily> family() const { return family_; }
  const std::string& description() const { return description_; }
  // The tool-call format the template's text teaches (None for the
  // hand-written families and templates without tools).
  ToolFormat tool_format() const { return tool_format_; }

 private:
  ChatTemplate() = default;
  nlohmann::ordered_json variables(const ChatInputs& in) const;
  nlohmann::ordered_json adapt_messages(const nlohmann::ordered_json& messages) const;
  void probe_tool_call_turns();

  std::optional<ChatFamily> family_;
  std::shared_ptr<const jinja::Template> jinja_;
  std::string description_, fingerprint_;
  ToolFormat tool_format_ = ToolFormat::None;
  std::optional<std::string> bos_, eos_;  // token texts, when the vocabulary has them
  bool strip_bos_ = false, strip_eos_ = false;
  // What the template does with message content, found by rendering probes:
  // it prints a string, and/or it reads [{"type": "text", ...}] parts.
  bool takes_string_ = true, takes_parts_ = false;
  // How an assistant turn with tool_calls and a null content reaches the
  // template, also found by probes: null as Hugging Face passes it (many
  // templates test `content is none` to render the calls), unless the
  // template fails on null or prints it; arguments as objects (as vLLM
  // passes them) unless only the client's JSON string lets the call render.
  bool null_with_calls_ = false, string_arguments_ = false;
};

// Messages as the hand-written families take them: role and text only
// (text parts joined, null content empty).
std::vector<ChatMessage> plain_messages(const nlohmann::ordered_json& messages);

}  // namespace kvs::server
