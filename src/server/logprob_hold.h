// A choice's token logprobs, held until the text they spell has gone out.
// The engine holds text back while it may be the start of a stop string and
// cuts it at one (sched/engine_loop.cpp, deliver); a token's logprob must
// not be sent before its text, nor at all when a stop string cut its text.
#pragma once
#include <cstddef>
#include <deque>
#include <vector>

#include "sched/request.h"
#include "server/openai_codec.h"

namespace kvs::server {

class LogprobHold {
 public:
  // The event's token joins the held ones; returns those whose text is now
  // out, counting the event's new text (`e.text` as the engine gave it,
  // before echo or tool-call parsing). The final event of a `stop` finish
  // lists the tokens that spell the kept text, the last of them the one the
  // kept text ends in; any other finish lists every token left.
  std::vector<LogprobEntry> take(const sched::TokenEvent& e, const TokenText& token_text);

 private:
  struct Held {
    LogprobEntry entry;
    size_t bytes = 0;  // of the token's text
  };
  std::deque<Held> held_;
  size_t text_out_ = 0;  // bytes of text the engine released
  size_t listed_ = 0;    // bytes the listed tokens spell
};

}  // namespace kvs::server
