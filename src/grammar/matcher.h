// Where a grammar's derivation can be after some text: a set of stacks of
// (rule, alternative, position) frames, each stack's top waiting for a
// character class (or empty: the text so far is a whole sentence). The
// stacks live in a hash-consed arena, so equal stacks share their frames
// and a set of them is a sorted vector of ids.
//
// accept() moves the state over bytes (UTF-8, possibly split between
// calls); token_mask.h asks it, without changing it, which tokens could
// come next. Copying a matcher copies the state (n > 1 choices fork it).
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace kvs::grammar {

// The stacks of every matcher of one grammar, and what each expands to.
class StackArena {
 public:
  explicit StackArena(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {}
  const Grammar& grammar() const { return *g_; }
  struct Node {
    uint32_t rule, alt, pos;
    int32_t parent;  // -1: the bottom
  };
  int32_t intern(uint32_t rule, uint32_t alt, uint32_t pos, int32_t parent);
  const Node& node(int32_t id) const { return nodes_[size_t(id)]; }
  // The stacks `id` expands to: tops at a character class; -1 for "may end".
  const std::vector<int32_t>& expand(int32_t id);
  // The class a (expanded) stack's top waits for.
  const CharClass& top_class(int32_t id) const;
  // The stack after its top class matched one character (expanded).
  const std::vector<int32_t>& step(int32_t id);
  size_t size() const { return nodes_.size(); }
  // Deepest expansion before GrammarError: a guard; validate()'s bound on
  // leading rule chains keeps real grammars far below it.
  static constexpr int kMaxDepth = 4096;

 private:
  void expand_into(int32_t id, std::vector<int32_t>& out, int depth);
  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;
  struct Key {
    uint64_t a, b;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return size_t(k.a * 0x9E3779B97F4A7C15ull ^ k.b); }
  };
  std::unordered_map<Key, int32_t, KeyHash> ids_;
  std::unordered_map<int32_t, std::vector<int32_t>> expanded_, stepped_;
};

// A sorted set of expanded stack ids (-1 = the grammar may end here).
using StackSet = std::vector<int32_t>;

// The stacks after one code point; empty when nothing accepts it.
StackSet advance(StackArena& arena, const StackSet& from, uint32_t cp);
bool can_end(const StackSet& s);
// Whether a UTF-8 character begun with `len` of its `need` bytes (bits so
// far in `cp`) may still be one that some stack accepts. Strict UTF-8 (as
// the detokenizer): no overlong forms, no surrogates, nothing past U+10FFFF.
bool may_complete(const StackArena& arena, const StackSet& s, uint32_t cp, int len, int need);
// A complete `need`-byte character decoded to `cp` is valid UTF-8.
bool utf8_valid_cp(uint32_t cp, int need);

class Matcher {
 public:
  // The grammar's start: its root rule's alternatives.
  explicit Matcher(std::shared_ptr<StackArena> arena);
  // Moves over `bytes`; false (the state unchanged) when the grammar does
  // not allow them here (a character left incomplete must be able to
  // become one it allows).
  bool accept(std::string_view bytes);
  bool can_end() const { return pending_len_ == 0 && grammar::can_end(stacks_); }
  // True when only the end is left (no character can follow).
  bool must_end() const;
  const StackSet& stacks() const { return stacks_; }
  StackArena& arena() const { return *arena_; }
  // A UTF-8 character begun in earlier bytes: its bytes so far.
  uint32_t pending() const { return pending_; }
  int pending_len() const { return pending_len_; }
  int pending_need() const { return pending_need_; }

 private:
  std::shared_ptr<StackArena> arena_;
  StackSet stacks_;
  uint32_t pending_ = 0;  // bits of the character begun
  int pending_len_ = 0, pending_need_ = 0;
};

}  // namespace kvs::grammar
