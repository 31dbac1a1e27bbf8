#include "server/request_fields.h"

#include <algorithm>

namespace kvs::server {

using nlohmann::json;

const std::vector<FieldSpec>& request_fields() {
  static const std::vector<FieldSpec> f = {
      {"model", true, true, FieldUse::Used, ""},
      {"prompt", true, false, FieldUse::Used, ""},
      {"messages", false, true, FieldUse::Used, ""},
      {"max_tokens", true, true, FieldUse::Used, ""},
      {"max_completion_tokens", false, true, FieldUse::Used, ""},
      {"temperature", true, true, FieldUse::Used, ""},
      {"top_p", true, true, FieldUse::Used, ""},
      {"n", true, true, FieldUse::Used, ""},
      {"stream", true, true, FieldUse::Used, ""},
      {"stream_options", true, true, FieldUse::Used, ""},
      {"stop", true, true, FieldUse::Used, ""},
      {"seed", true, true, FieldUse::Used, ""},
      {"presence_penalty", true, true, FieldUse::Used, ""},
      {"frequency_penalty", true, true, FieldUse::Used, ""},
      {"logit_bias", true, true, FieldUse::Used, ""},
      {"logprobs", true, true, FieldUse::Used, ""},
      {"top_logprobs", false, true, FieldUse::Used, ""},
      {"echo", true, false, FieldUse::Used, ""},
      // vLLM / llama.cpp extensions.
      {"top_k", true, true, FieldUse::Used, ""},
      {"min_p", true, true, FieldUse::Used, ""},
      {"repetition_penalty", true, true, FieldUse::Used, ""},
      {"ignore_eos", true, true, FieldUse::Used, ""},
      {"min_tokens", true, true, FieldUse::Used, ""},
      {"stop_token_ids", true, true, FieldUse::Used, ""},
      {"priority", true, true, FieldUse::Used, ""},
      {"slo_class", true, true, FieldUse::Used, ""},
      {"chat_template_kwargs", false, true, FieldUse::Used, ""},
      {"tools", false, true, FieldUse::Used, ""},
      {"tool_choice", false, true, FieldUse::Used, ""},
      {"parallel_tool_calls", false, true, FieldUse::Used, ""},
      // The client's own bookkeeping.
      {"user", true, true, FieldUse::Metadata, ""},
      {"metadata", true, true, FieldUse::Metadata, ""},
      {"store", true, true, FieldUse::Metadata, ""},
      {"service_tier", true, true, FieldUse::Metadata, ""},
      // Known, not implemented (or only in a trivial form).
      {"suffix", true, false, FieldUse::Unsupported, "insertion (a suffix after the completion) is not supported"},
      {"best_of", true, false, FieldUse::Unsupported, "best_of other than 1 is not supported; use n"},
      {"response_format", true, true, FieldUse::Used, ""},
      {"grammar", true, true, FieldUse::Used, ""},
      {"functions", false, true, FieldUse::Unsupported, "function calling (the deprecated 'functions') is not supported"},
      {"function_call", false, true, FieldUse::Unsupported,
       "function calling (the deprecated 'function_call') is not supported"},
      {"modalities", false, true, FieldUse::Unsupported, "only text output is supported"},
      {"audio", false, true, FieldUse::Unsupported, "audio output is not supported"},
      {"prediction", false, true, FieldUse::Unsupported, "predicted outputs are not supported"},
      {"reasoning_effort", false, true, FieldUse::Unsupported, "reasoning effort is not supported for these models"},
      {"web_search_options", false, true, FieldUse::Unsupported, "web search is not supported"},
  };
  return f;
}

namespace {

// The trivial forms of some unsupported fields change nothing: accepted.
bool trivial(const std::string& k, const json& v) {
  if (k == "best_of") return v.is_number_integer() && v.get<int64_t>() == 1;
  if (k == "modalities") return v == json::array({"text"});
  return false;
}

}  // namespace

void check_fields(Endpoint ep, const json& body) {
  const bool chat = ep == Endpoint::Chat;
  for (const auto& [k, v] : body.items()) {
    const auto& f = request_fields();
    auto it = std::find_if(f.begin(), f.end(), [&](const FieldSpec& s) { return k == s.name; });
    if (it == f.end() || !(chat ? it->chat : it->completions))
      throw bad_request("unknown field '" + k + "' for " + (chat ? "/v1/chat/completions" : "/v1/completions") +
                            " (docs/SERVER.md lists the fields kvserve takes)",
                        k);
    if (it->use != FieldUse::Unsupported || v.is_null()) continue;
    if (trivial(k, v)) continue;
    throw bad_request("'" + k + "': " + it->why, k);
  }
}

}  // namespace kvs::server
