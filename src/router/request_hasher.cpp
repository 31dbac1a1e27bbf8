#include "router/request_hasher.h"

#include "events/kv_event_codec.h"
#include "kv/prefix_chain.h"
#include "sched/clock.h"
#include "server/chat_prompt.h"
#include "server/openai_codec.h"
#include "tokenizer/tokenizer.h"

namespace kvs::router {

RequestHasher::RequestHasher(const Tokenizer& tok, server::ChatTemplate chat, server::TenantRegistry& tenants)
    : tok_(tok), chat_(std::move(chat)), tenants_(tenants) {}

void RequestHasher::set_model(const std::string& model_identity, int block_size) {
  identity_ = model_identity;
  block_size_ = block_size;
}

PromptHashes RequestHasher::hash(const std::string& path, const std::string& body,
                                 const std::string& authorization) const {
  PromptHashes out;
  if (block_size_ <= 0) return out;
  const bool chat = path.find("chat/completions") != std::string::npos;
  server::ParsedRequest p;
  try {
    p = server::parse_request(chat ? server::Endpoint::Chat : server::Endpoint::Completions, body);
  } catch (const server::ApiError&) {
    return out;
  }
  const auto caller = tenants_.authenticate(authorization);
  if (!caller) return out;
  // Tokens exactly as the worker's ApiService::prepare makes them.
  const bool add_bos = tok_.vocab().add_bos;
  std::vector<int32_t> tokens;
  if (chat) {
    std::string text;
    try {
      text = server::chat_prompt(chat_, p);
    } catch (const server::ApiError&) {
      return out;
    }
    const std::vector<int> ids = tok_.encode(text, add_bos, true);
    tokens.assign(ids.begin(), ids.end());
  } else if (!p.prompts.empty()) {
    const server::PromptInput& in = p.prompts[0];
    if (in.ids) {
      tokens = *in.ids;
    } else {
      const std::vector<int> ids = tok_.encode(in.text, add_bos, false);
      tokens.assign(ids.begin(), ids.end());
    }
  }
  out.prompt_tokens = int(tokens.size());
  // The worker's scope (TenantRegistry::scope_for), bound to the model
  // identity as the worker's pool binds it, and the same chain walk.
  const Scope caller_scope = tenants_.scope_for(caller->policy.id, identity_, sched::steady_now());
  for (const BlockKey& k : chain_keys(tokens, block_size_, kv_scope(identity_, caller_scope)))
    out.hashes.push_back(events::block_hash(k));
  return out;
}

}  // namespace kvs::router
