#include "server/chat_family.h"

namespace kvs::server {

const char* to_string(ChatFamily f) {
  switch (f) {
    case ChatFamily::Llama2: return "llama2";
    case ChatFamily::Llama3: return "llama3";
    case ChatFamily::ChatML: return "chatml";
    case ChatFamily::Mistral: return "mistral";
    case ChatFamily::Plain: return "plain";
  }
  return "?";
}

std::optional<ChatFamily> parse_chat_family(const std::string& n) {
  if (n == "llama2") return ChatFamily::Llama2;
  if (n == "llama3") return ChatFamily::Llama3;
  if (n == "chatml" || n == "qwen") return ChatFamily::ChatML;
  if (n == "mistral") return ChatFamily::Mistral;
  if (n == "plain") return ChatFamily::Plain;
  return std::nullopt;
}

namespace {

std::string system_text(const std::vector<ChatMessage>& m) {
  std::string s;
  for (const auto& x : m)
    if (x.role == "system") s += (s.empty() ? "" : "\n") + x.content;
  return s;
}

// [INST] families: user/assistant alternate; the system text joins the first
// user turn (Llama 2 in <<SYS>> markers, Mistral as a plain paragraph).
std::string render_inst(const std::vector<ChatMessage>& m, bool llama2) {
  const std::string sys = system_text(m);
  std::string out;
  bool first_user = true, open_turn = false;
  for (const auto& x : m) {
    if (x.role == "system") continue;
    if (x.role == "assistant") {
      out += " " + x.content + " </s>";
      open_turn = false;
      continue;
    }
    if (!out.empty() && !open_turn) out += "<s>";  // later turns start a new sequence
    std::string user = x.content;
    if (first_user && !sys.empty())
      user = llama2 ? "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" + user : sys + "\n\n" + user;
    first_user = false;
    out += "[INST] " + user + " [/INST]";
    open_turn = true;
  }
  return out;
}

}  // namespace

std::string render_chat(ChatFamily f, const std::vector<ChatMessage>& m, bool add_generation_prompt) {
  std::string out;
  switch (f) {
    case ChatFamily::Llama3:
      for (const auto& x : m) out += "<|start_header_id|>" + x.role + "<|end_header_id|>\n\n" + x.content + "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatFamily::ChatML:
      for (const auto& x : m) out += "<|im_start|>" + x.role + "\n" + x.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatFamily::Llama2: return render_inst(m, true);
    case ChatFamily::Mistral: return render_inst(m, false);
    case ChatFamily::Plain:
      for (const auto& x : m) out += x.role + ": " + x.content + "\n";
      if (add_generation_prompt) out += "assistant:";
      return out;
  }
  return out;
}

}  // namespace kvs::server
