#include "grammar/token_mask.h"

#include <algorithm>
#include <map>

namespace kvs::grammar {

VocabTrie::VocabTrie(const std::vector<std::string>& pieces) : n_tokens_(pieces.size()) {
  // Build over sorted texts: each node's children and tokens are contiguous.
  std::vector<int32_t> order;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (!pieces[i].empty()) order.push_back(int32_t(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pieces[size_t(a)] < pieces[size_t(b)]; });
  // Nested map trie first (simple), then flattened breadth-first.
  struct Tmp {
    std::map<uint8_t, size_t> kids;
    std::vector<int32_t> toks;
  };
  std::vector<Tmp> tmp(1);
  for (int32_t id : order) {
    size_t at = 0;
    for (unsigned char b : pieces[size_t(id)]) {
      auto it = tmp[at].kids.find(b);
      if (it == tmp[at].kids.end()) {
        tmp.push_back({});
        it = tmp[at].kids.emplace(b, tmp.size() - 1).first;
      }
      at = it->second;
    }
    tmp[at].toks.push_back(id);
  }
  std::vector<size_t> bfs = {0};
  std::vector<uint32_t> index(tmp.size(), 0);
  for (size_t k = 0; k < bfs.size(); ++k)
    for (const auto& [b, c] : tmp[bfs[k]].kids) {
      index[c] = uint32_t(bfs.size());
      bfs.push_back(c);
    }
  nodes_.resize(bfs.size());
  for (size_t k = 0; k < bfs.size(); ++k) {
    const Tmp& t = tmp[bfs[k]];
    Node& n = nodes_[k];
    n.first_child = uint32_t(edges_.size());
    n.n_children = uint32_t(t.kids.size());
    for (const auto& [b, c] : t.kids) edges_.push_back({b, index[c]});
    n.first_token = uint32_t(tokens_.size());
    n.n_tokens = uint32_t(t.toks.size());
    tokens_.insert(tokens_.end(), t.toks.begin(), t.toks.end());
  }
}

namespace {

struct Utf8 {
  uint32_t cp = 0;
  int len = 0, need = 0;
};

bool any_accepts(const StackArena& arena, const StackSet& st, const Utf8& u) {
  return may_complete(arena, st, u.cp, u.len, u.need);
}

struct Walk {
  const VocabTrie& trie;
  StackArena& arena;
  std::vector<uint64_t>& mask;
  void allow_tokens(const VocabTrie::Node& n) {
    for (uint32_t k = 0; k < n.n_tokens; ++k) {
      const int32_t t = trie.token(n.first_token + k);
      mask[size_t(t) / 64] |= uint64_t(1) << (t % 64);
    }
  }
  // Node `at` reached with stacks `st` and a character begun `u`.
  void visit(uint32_t at, const StackSet& st, Utf8 u, int depth) {
    const VocabTrie::Node& n = trie.node(at);
    if (depth > 0 && (u.len == 0 || any_accepts(arena, st, u))) allow_tokens(n);
    for (uint32_t e = 0; e < n.n_children; ++e) {
      const VocabTrie::Edge& ed = trie.edge(n.first_child + e);
      const unsigned char b = ed.byte;
      Utf8 v = u;
      if (v.len == 0) {
        v.need = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
        if (v.need == 0) continue;
        v.cp = v.need == 1 ? b : v.need == 2 ? b & 0x1F : v.need == 3 ? b & 0x0F : b & 0x07;
      } else {
        if ((b & 0xC0) != 0x80) continue;
        v.cp = (v.cp << 6) | (b & 0x3F);
      }
      if (++v.len < v.need) {
        if (any_accepts(arena, st, v)) visit(ed.node, st, v, depth + 1);
        continue;
      }
      if (!utf8_valid_cp(v.cp, v.need)) continue;
      const StackSet next = advance(arena, st, v.cp);
      if (!next.empty()) visit(ed.node, next, Utf8{}, depth + 1);
    }
  }
};

}  // namespace

size_t MaskCache::KeyHash::operator()(const Key& k) const {
  uint64_t h = 0xcbf29ce484222325ull ^ k.pending ^ (uint64_t(k.len) << 40) ^ (uint64_t(k.need) << 48);
  for (int32_t s : k.stacks) h = (h ^ uint32_t(s)) * 0x100000001b3ull;
  return size_t(h);
}

const std::vector<uint64_t>& MaskCache::get(const Matcher& m, const VocabTrie& trie) {
  Key k{m.stacks(), m.pending(), m.pending_len(), m.pending_need()};
  auto it = masks_.find(k);
  if (it != masks_.end()) {
    ++hits_;
    return it->second;
  }
  ++misses_;
  if (masks_.size() >= cap_) masks_.clear();  // a long walk through new states: start over
  return masks_.emplace(std::move(k), allowed_tokens(m, trie)).first->second;
}

std::vector<uint64_t> allowed_tokens(const Matcher& m, const VocabTrie& trie) {
  std::vector<uint64_t> mask((trie.n_tokens() + 63) / 64, 0);
  Walk w{trie, m.arena(), mask};
  w.visit(0, m.stacks(), Utf8{m.pending(), m.pending_len(), m.pending_need()}, 0);
  return mask;
}

}  // namespace kvs::grammar
