// The text side of a chat: system prompt, the rolling summary of evicted
// turns, and the turns still in the window. Plain data and rendering; no
// model. The session (chat_session.h) decides when turns leave and keeps the
// KV in step with what render() returns.
//
// The summary sits right after the system prompt, inside the system message,
// so every chat template carries it and it precedes all kept turns.
#pragma once
#include <deque>
#include <string>
#include <vector>

#include "server/chat_family.h"
#include "server/chat_template.h"

namespace kvs::chat {

struct Turn {
  std::string user, assistant;
};

class Conversation {
 public:
  Conversation(server::ChatTemplate tmpl, std::string system);

  // Prompt text for the kept turns plus `pending_user`, ending with the
  // opening of the assistant's turn (the chat template; for the plain
  // fallback, replies are kept exactly as generated after "assistant:").
  // A template that refuses the system role gets the system text at the
  // start of the first user message instead. Throws
  // server::ChatTemplateError when the template cannot render them.
  std::string render(const std::string& pending_user) const;
  // render() as if no turn were kept and there were no summary: the least
  // any prompt for `pending_user` can be.
  std::string render_alone(const std::string& pending_user) const;
  // The messages render() formats: system (with the summary), the kept
  // turns, then `pending_user` when given.
  std::vector<server::ChatMessage> messages(const std::string* pending_user) const;

  void add_turn(std::string user, std::string assistant);
  // Removes and returns the oldest kept turn; the deque must not be empty.
  Turn pop_oldest();
  void set_summary(std::string s) { summary_ = std::move(s); }
  const std::string& summary() const { return summary_; }
  const std::string& system() const { return system_; }
  void set_system(std::string s) { system_ = std::move(s); }
  const std::deque<Turn>& turns() const { return turns_; }
  const server::ChatTemplate& chat_template() const { return tmpl_; }
  // Forgets turns and summary; the system prompt stays.
  void clear();

 private:
  server::ChatTemplate tmpl_;
  std::string system_, summary_;
  std::deque<Turn> turns_;
};

// `messages` through `tmpl` as a prompt for the tokenizer (with a
// generation prompt): what the session renders besides the conversation.
std::string render_messages(const server::ChatTemplate& tmpl, const std::vector<server::ChatMessage>& messages);

// "user: ...\nassistant: ...\n" lines of `turns`, the input of a summary.
std::string transcript(const std::vector<Turn>& turns);

}  // namespace kvs::chat
