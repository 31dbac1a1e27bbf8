// A request's token budget in a context of `ctx` tokens: whether its prompt
// leaves room, and how many tokens it may generate. The one computation the
// server (its 400 before anything is queued) and the scheduler (admission,
// for every other caller) share, so the two can never disagree.
//
//   prompt >= ctx                      refused: no room for one new token
//   max_tokens given, < 1              refused
//   max_tokens given, prompt + it > ctx  refused (as OpenAI and vLLM do)
//   max_tokens not given               min(default, ctx - prompt)
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace kvs::sched {

struct TokenBudget {
  int max_tokens = 0;          // the hard stop, when ok()
  std::string error;           // why the request cannot run (empty: it can)
  bool context_length = false; // the error is the context's size (HTTP 400 context_length_exceeded)
  bool ok() const { return error.empty(); }
};

// `what` names the prompt in the message ("the prompt", "prompt[2]").
TokenBudget token_budget(int64_t prompt_tokens, std::optional<int> max_tokens, int ctx, int default_max_tokens,
                         const std::string& what = "the prompt");

}  // namespace kvs::sched
