#include "sched/token_budget.h"

#include <algorithm>

namespace kvs::sched {

TokenBudget token_budget(int64_t P, std::optional<int> max_tokens, int ctx, int default_max_tokens,
                         const std::string& what) {
  TokenBudget b;
  if (max_tokens && *max_tokens < 1) {
    b.error = "max_tokens must be >= 1";
    return b;
  }
  if (P >= ctx || (max_tokens && P + int64_t(*max_tokens) > ctx)) {
    b.context_length = true;
    b.error = "this model's context is " + std::to_string(ctx) + " tokens; " + what + " has " + std::to_string(P) +
              " and max_tokens is " + (max_tokens ? std::to_string(*max_tokens) : std::string("unset")) +
              (P >= ctx ? ", which leaves no room for a new token" : "");
    return b;
  }
  b.max_tokens = max_tokens ? *max_tokens : int(std::min<int64_t>(default_max_tokens, ctx - P));
  return b;
}

}  // namespace kvs::sched
