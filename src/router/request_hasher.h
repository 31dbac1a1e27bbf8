// The block hashes a worker will key a request's prompt under, computed on
// the router so it can look them up in the prefix index: the same tokenizer
// (the model's vocabulary), the same chat template, the same scope (the
// caller's tenant from the same --api-keys file and the same cache secret,
// folded with the model identity the workers report), the same chained
// SHA-256 block keys (kv/prefix_hash.h) and the same integer form as the
// events (events/kv_event_codec.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "server/chat_template.h"
#include "server/tenants.h"

namespace kvs {
class Tokenizer;
}

namespace kvs::router {

struct PromptHashes {
  std::vector<uint64_t> hashes;  // one per full block of the first prompt
  int prompt_tokens = 0;
};

class RequestHasher {
 public:
  // None of the references is owned; all must outlive the hasher.
  RequestHasher(const Tokenizer& tok, server::ChatTemplate chat, server::TenantRegistry& tenants);
  // What the workers reported (GET /health): set before the first hash().
  void set_model(const std::string& model_identity, int block_size);
  int block_size() const { return block_size_; }

  // `path`: /v1/completions or /v1/chat/completions (with or without /v1).
  // Empty hashes when the body does not parse or the key is unknown: the
  // worker will answer that request with its error.
  PromptHashes hash(const std::string& path, const std::string& body, const std::string& authorization) const;

 private:
  const Tokenizer& tok_;
  server::ChatTemplate chat_;
  server::TenantRegistry& tenants_;
  std::string identity_;
  int block_size_ = 0;
};

}  // namespace kvs::router
