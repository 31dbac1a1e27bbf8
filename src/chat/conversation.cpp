#include "chat/conversation.h"

#include <stdexcept>

namespace kvs::chat {

Conversation::Conversation(server::ChatTemplate tmpl, std::string system)
    : tmpl_(std::move(tmpl)), system_(std::move(system)) {}

std::string render_messages(const server::ChatTemplate& tmpl, const std::vector<server::ChatMessage>& messages) {
  server::ChatInputs in;
  for (const server::ChatMessage& m : messages) in.messages.push_back({{"role", m.role}, {"content", m.content}});
  return tmpl.render(in);
}

std::vector<server::ChatMessage> Conversation::messages(const std::string* pending_user) const {
  std::vector<server::ChatMessage> m;
  std::string sys = system_;
  if (!summary_.empty()) sys += (sys.empty() ? "" : "\n\n") + std::string("Summary of the earlier conversation: ") + summary_;
  if (!sys.empty()) m.push_back({"system", sys});
  for (const Turn& t : turns_) {
    m.push_back({"user", t.user});
    m.push_back({"assistant", t.assistant});
  }
  if (pending_user) m.push_back({"user", *pending_user});
  return m;
}

std::string Conversation::render(const std::string& pending_user) const {
  if (tmpl_.family() != server::ChatFamily::Plain) {
    std::vector<server::ChatMessage> m = messages(&pending_user);
    try {
      return render_messages(tmpl_, m);
    } catch (const server::ChatTemplateError& e) {
      // Templates without a system role (Gemma 2's raises "System role not
      // supported") get the system text at the start of the first user
      // message, as Gemma 3's own template places it.
      if (!e.raised() || m.size() < 2 || m[0].role != "system") throw;
      m[1].content = m[0].content + "\n\n" + m[1].content;
      m.erase(m.begin());
      return render_messages(tmpl_, m);
    }
  }
  // The plain fallback's lines, except that a reply follows "assistant:"
  // exactly as generated (the model picks the space or not), so the text of
  // a finished turn is a prefix of the next prompt and the KV only appends.
  std::string out;
  for (const server::ChatMessage& m : messages(&pending_user))
    out += m.role + (m.role == "assistant" ? ":" : ": ") + m.content + "\n";
  return out + "assistant:";
}

std::string Conversation::render_alone(const std::string& pending_user) const {
  return Conversation(tmpl_, system_).render(pending_user);
}

void Conversation::add_turn(std::string user, std::string assistant) {
  turns_.push_back({std::move(user), std::move(assistant)});
}

Turn Conversation::pop_oldest() {
  if (turns_.empty()) throw std::logic_error("conversation: no turn to evict");
  Turn t = std::move(turns_.front());
  turns_.pop_front();
  return t;
}

void Conversation::clear() {
  turns_.clear();
  summary_.clear();
}

std::string transcript(const std::vector<Turn>& turns) {
  std::string s;
  for (const Turn& t : turns) s += "user: " + t.user + "\nassistant: " + t.assistant + "\n";
  return s;
}

}  // namespace kvs::chat
