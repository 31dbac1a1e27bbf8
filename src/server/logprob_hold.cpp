#include "server/logprob_hold.h"

namespace kvs::server {

std::vector<LogprobEntry> LogprobHold::take(const sched::TokenEvent& e, const TokenText& token_text) {
  if (e.logprob) held_.push_back({{*e.logprob, e.top_logprobs}, token_text(e.logprob->token).size()});
  text_out_ += e.text.size();
  const bool final = e.finish != sched::FinishReason::None;
  const bool cut = e.finish == sched::FinishReason::Stop;  // a stop string may have cut the text
  std::vector<LogprobEntry> out;
  while (!held_.empty()) {
    const Held& h = held_.front();
    const bool whole = listed_ + h.bytes <= text_out_;
    // At the end a token whose text the stop string cut part of is listed;
    // one that starts past the kept text is not.
    if (!whole && !(final && (!cut || listed_ < text_out_))) break;
    listed_ += h.bytes;
    out.push_back(h.entry);
    held_.pop_front();
  }
  if (final) held_.clear();
  return out;
}

}  // namespace kvs::server
