// Which tokens a grammar allows next. The vocabulary's token texts (bytes)
// form a trie, walked once per mask: a subtree is cut as soon as its bytes
// leave the grammar, so the cost follows the tokens that stay possible, not
// the vocabulary's size.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.h"

namespace kvs::grammar {

class VocabTrie {
 public:
  // pieces[id]: the bytes token `id` adds to the text ("" for control
  // tokens: never allowed by a grammar). Immutable once built.
  explicit VocabTrie(const std::vector<std::string>& pieces);
  size_t n_tokens() const { return n_tokens_; }

  struct Node {
    uint32_t first_child = 0, n_children = 0;  // into children_, sorted by byte
    uint32_t first_token = 0, n_tokens = 0;    // into tokens_: tokens whose text ends here
  };
  struct Edge {
    uint8_t byte;
    uint32_t node;
  };
  const Node& node(uint32_t i) const { return nodes_[i]; }
  const Edge& edge(uint32_t i) const { return edges_[i]; }
  int32_t token(uint32_t i) const { return tokens_[i]; }

 private:
  std::vector<Node> nodes_;  // [0] is the root (the empty text)
  std::vector<Edge> edges_;
  std::vector<int32_t> tokens_;
  size_t n_tokens_ = 0;
};

// One bit per token: set when the grammar allows it after `m`'s text.
// Tokens with empty text are never set (end of generation is the caller's:
// allowed when m.can_end()).
std::vector<uint64_t> allowed_tokens(const Matcher& m, const VocabTrie& trie);

// Masks by matcher state, for one grammar and one vocabulary: generation
// keeps returning to the same states (every character inside a JSON string
// leads back to "inside a string"), so most draws find their mask here.
class MaskCache {
 public:
  explicit MaskCache(size_t capacity = 256) : cap_(capacity) {}
  const std::vector<uint64_t>& get(const Matcher& m, const VocabTrie& trie);
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }

 private:
  struct Key {
    StackSet stacks;
    uint32_t pending;
    int len, need;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  size_t cap_, hits_ = 0, misses_ = 0;
  std::unordered_map<Key, std::vector<uint64_t>, KeyHash> masks_;
};

inline bool mask_has(const std::vector<uint64_t>& mask, int32_t t) {
  return t >= 0 && size_t(t) / 64 < mask.size() && (mask[size_t(t) / 64] >> (t % 64) & 1);
}

}  // namespace kvs::grammar
