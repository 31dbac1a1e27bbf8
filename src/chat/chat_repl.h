// The terminal loop of `kvserve chat`: reads messages (multi-line with a
// trailing backslash or between lines of three double quotes), runs
// commands, streams replies. Works on any pair of streams, so tests drive it
// with strings and `kvserve chat` with the terminal (also under tmux).
//
// Commands: /help, /reset, /stats, /quit (also /exit, /bye).
// Before each reply the device monitor (when there is one) is polled: its
// plan caps the reply length, picks the KV format of the next rebuild, and
// at the critical level the message is declined with a note instead of run.
#pragma once
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "chat/chat_session.h"
#include "device/device_monitor.h"

namespace kvs::chat {

// An extra command: name (without the slash) -> handler(argument, output);
// the handler returns false to end the chat.
struct ReplCommand {
  std::string name, help;
  std::function<bool(const std::string& arg, std::ostream& out)> run;
};

class ChatRepl {
 public:
  // monitor may be null (no device signals); clock: monotonic seconds.
  ChatRepl(ChatSession& session, std::istream& in, std::ostream& out, device::DeviceMonitor* monitor = nullptr,
           std::function<double()> clock = {});
  void add_command(ReplCommand c) { extra_.push_back(std::move(c)); }
  // Until end of input or /quit.
  void run();
  // One message or command; false: quit.
  bool handle(const std::string& input);
  std::string stats_text() const;

 private:
  ChatSession& s_;
  std::istream& in_;
  std::ostream& out_;
  device::DeviceMonitor* mon_;
  std::function<double()> clock_;
  std::vector<ReplCommand> extra_;
  int base_max_tokens_ = 0;

  bool read_message(std::string& msg);
  bool command(const std::string& line);
  // Applies the device plan; false when the message must be declined.
  bool apply_device();
  void reply(const std::string& msg);
};

}  // namespace kvs::chat
