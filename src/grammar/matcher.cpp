#include "grammar/matcher.h"

#include <algorithm>

namespace kvs::grammar {

int32_t StackArena::intern(uint32_t rule, uint32_t alt, uint32_t pos, int32_t parent) {
  const Key k{uint64_t(rule) << 32 | alt, uint64_t(pos) << 32 | uint32_t(parent)};
  auto [it, fresh] = ids_.try_emplace(k, int32_t(nodes_.size()));
  if (fresh) nodes_.push_back({rule, alt, pos, parent});
  return it->second;
}

// Left recursion is refused at build time, so the depth is bounded by the
// rules' nesting; the cap is a guard against a pathological grammar (its
// request fails alone, sched/scheduler_update.cpp).
void StackArena::expand_into(int32_t id, std::vector<int32_t>& out, int depth) {
  if (depth > kMaxDepth) throw GrammarError("grammar: nesting too deep to match");
  if (id < 0) {
    out.push_back(-1);
    return;
  }
  const Node n = nodes_[size_t(id)];
  const Sequence& seq = g_->rules[n.rule].alts[n.alt];
  if (n.pos == seq.size()) return expand_into(n.parent, out, depth + 1);
  const Symbol s = seq[n.pos];
  if (!s.is_rule) {
    out.push_back(id);
    return;
  }
  // A rule in last place returns straight to the parent (a tail call), so
  // right recursion such as `x*` does not grow the stack with the text.
  const int32_t cont = n.pos + 1 == seq.size() ? n.parent : intern(n.rule, n.alt, n.pos + 1, n.parent);
  const size_t alts = g_->rules[s.id].alts.size();
  for (uint32_t a = 0; a < alts; ++a) expand_into(intern(s.id, a, 0, cont), out, depth + 1);
}

const std::vector<int32_t>& StackArena::expand(int32_t id) {
  auto it = expanded_.find(id);
  if (it != expanded_.end()) return it->second;
  std::vector<int32_t> out;
  expand_into(id, out, 0);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return expanded_.emplace(id, std::move(out)).first->second;
}

const CharClass& StackArena::top_class(int32_t id) const {
  const Node& n = nodes_[size_t(id)];
  return g_->classes[g_->rules[n.rule].alts[n.alt][n.pos].id];
}

const std::vector<int32_t>& StackArena::step(int32_t id) {
  auto it = stepped_.find(id);
  if (it != stepped_.end()) return it->second;
  const Node n = nodes_[size_t(id)];
  std::vector<int32_t> out = expand(intern(n.rule, n.alt, n.pos + 1, n.parent));
  return stepped_.emplace(id, std::move(out)).first->second;
}

StackSet advance(StackArena& arena, const StackSet& from, uint32_t cp) {
  StackSet next;
  for (int32_t s : from) {
    if (s < 0 || !arena.top_class(s).matches(cp)) continue;
    const std::vector<int32_t>& st = arena.step(s);
    next.insert(next.end(), st.begin(), st.end());
  }
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  return next;
}

bool can_end(const StackSet& s) { return !s.empty() && s.front() == -1; }

namespace {
constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
constexpr uint32_t kMax[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
}  // namespace

bool utf8_valid_cp(uint32_t cp, int need) {
  return need >= 1 && need <= 4 && cp >= kMin[need] && cp <= kMax[need] && !(cp >= 0xD800 && cp <= 0xDFFF);
}

bool may_complete(const StackArena& arena, const StackSet& s, uint32_t cp, int len, int need) {
  const int missing = need - len;
  uint32_t lo = cp << (6 * missing), hi = lo | ((1u << (6 * missing)) - 1);
  lo = std::max(lo, kMin[need]);
  hi = std::min(hi, kMax[need]);
  // The valid code points of [lo, hi]: below and above the surrogates.
  const uint32_t parts[2][2] = {{lo, std::min(hi, 0xD7FFu)}, {std::max(lo, 0xE000u), hi}};
  for (int32_t x : s) {
    if (x < 0) continue;
    for (const auto& p : parts)
      if (p[0] <= p[1] && arena.top_class(x).matches_any(p[0], p[1])) return true;
  }
  return false;
}

Matcher::Matcher(std::shared_ptr<StackArena> arena) : arena_(std::move(arena)) {
  const Grammar& g = arena_->grammar();
  for (uint32_t a = 0; a < g.rules[g.root].alts.size(); ++a) {
    const std::vector<int32_t>& e = arena_->expand(arena_->intern(g.root, a, 0, -1));
    stacks_.insert(stacks_.end(), e.begin(), e.end());
  }
  std::sort(stacks_.begin(), stacks_.end());
  stacks_.erase(std::unique(stacks_.begin(), stacks_.end()), stacks_.end());
}

bool Matcher::must_end() const { return pending_len_ == 0 && stacks_.size() == 1 && stacks_[0] == -1; }

bool Matcher::accept(std::string_view bytes) {
  StackSet st = stacks_;
  uint32_t cp = pending_;
  int len = pending_len_, need = pending_need_;
  for (unsigned char b : bytes) {
    if (len == 0) {
      need = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
      if (need == 0) return false;
      cp = need == 1 ? b : need == 2 ? b & 0x1F : need == 3 ? b & 0x0F : b & 0x07;
    } else {
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (++len < need) continue;
    if (!utf8_valid_cp(cp, need)) return false;
    st = advance(*arena_, st, cp);
    if (st.empty()) return false;
    len = 0;
    cp = 0;
  }
  if (len > 0 && !may_complete(*arena_, st, cp, len, need)) return false;
  stacks_ = std::move(st);
  pending_ = cp;
  pending_len_ = len;
  pending_need_ = need;
  return true;
}

}  // namespace kvs::grammar
