// One hash of everything in a vocabulary that decides how text becomes
// token ids, so that two processes can tell whether they tokenize alike
// without shipping the vocabulary: a worker reports it in /health and
// `kvserve router` compares it with its own -m's (the router hashes
// prompts with its own tokenizer, so a different vocabulary mis-routes
// every request silently).
#pragma once
#include <string>

#include "tokenizer/vocab.h"

namespace kvs {

// "vocab-v1:" + SHA-256 hex of the pieces, scores, types, merges, strip
// bits, special ids and flags (the chat templates are not part of it).
std::string vocab_fingerprint(const Vocab& v);

}  // namespace kvs
