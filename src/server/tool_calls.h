// Tool calls out of a model's text, in the format its chat template teaches
// it, streamed: content that is surely not part of a call goes out at once,
// a call is held until it is complete and then comes out whole (name and
// all its arguments: one delta per call, which the OpenAI SDK assembles as
// it does fragments).
//
//   hermes    <tool_call>{"name": N, "arguments": {...}}</tool_call>  (Qwen, Hermes, GLM, ...)
//             <tool_call><function=N><parameter=P>value</parameter>...</function></tool_call>
//   llama3    <|python_tag|>{"name": N, "parameters": {...}}  or a reply that is only that JSON
//   mistral   [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]  or [TOOL_CALLS]N[ARGS]{...}
//   harmony   <|channel|>commentary to=functions.N <|constrain|>json<|message|>{...}   (gpt-oss; the
//             analysis channel is reasoning, the final channel is the content)
//   deepseek  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>
//   granite   <|tool_call|>[{"name": N, "arguments": {...}}]
//
// A call whose text does not parse stays content (the client sees what the
// model wrote), never a silent drop. Arguments are a JSON object's text.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs::server {

enum class ToolFormat { None, Hermes, Llama3, Mistral, Harmony, DeepSeek, Granite, Functionary };
const char* to_string(ToolFormat f);
// The format a chat template's text teaches (None when it has no tools).
ToolFormat tool_format_of(const std::string& chat_template);

struct ToolCall {
  std::string id;         // "call_..." (the model's own when it gave one)
  std::string name;
  std::string arguments;  // JSON object text
};

struct ToolParse {
  std::string content;    // text for the client's content
  std::string reasoning;  // harmony's analysis channel
  std::vector<ToolCall> calls;
};

class ToolCallParser {
 public:
  // `id_prefix`: calls are named id_prefix + index when the model gives none.
  ToolCallParser(ToolFormat f, std::string id_prefix);
  // The next piece of generated text (special tokens' text included).
  ToolParse push(std::string_view text);
  // Generation ended: whatever is held comes out (an open call that parses
  // is a call, else content).
  ToolParse finish();
  int calls() const { return n_calls_; }

 private:
  ToolParse scan(bool final);
  ToolParse scan_harmony(bool final);
  void harmony_header(std::string_view header);
  void harmony_body(std::string_view piece, bool complete, ToolParse& out);
  bool region(bool final, ToolParse& out);
  void emit_content(std::string_view s, ToolParse& out);
  bool parse_region(std::string_view body, ToolParse& out);
  ToolFormat f_;
  std::string prefix_;
  std::string buf_;           // text not yet decided
  bool started_ = false;      // something other than whitespace was seen (llama3's bare JSON rule)
  int n_calls_ = 0;
  // Harmony: inside a message's body, of this channel, to this recipient.
  bool in_body_ = false;
  std::string channel_, recipient_, call_body_;
};

}  // namespace kvs::server
