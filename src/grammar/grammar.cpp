#include "grammar/grammar.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace kvs::grammar {

bool CharClass::matches(uint32_t cp) const {
  bool in = false;
  for (const CharRange& r : ranges)
    if (cp >= r.lo && cp <= r.hi) {
      in = true;
      break;
    }
  return in != negated;
}

bool CharClass::matches_any(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (const CharRange& r : ranges)
      if (r.lo <= hi && r.hi >= lo) return true;
    return false;
  }
  // Negated: some code point of [lo, hi] lies outside every range.
  std::vector<CharRange> rs = ranges;
  std::sort(rs.begin(), rs.end(), [](const CharRange& a, const CharRange& b) { return a.lo < b.lo; });
  uint32_t next = lo;
  for (const CharRange& r : rs) {
    if (r.hi < next) continue;
    if (r.lo > next) return true;
    if (r.hi >= hi) return false;
    next = r.hi + 1;
  }
  return next <= hi;
}

namespace {

// Which rules can derive the empty string: each alternative counts its
// symbols not yet known to be nullable, and a rule found nullable counts
// down the alternatives that use it (linear in the grammar's size).
std::vector<char> nullable_rules(const Grammar& g) {
  std::vector<char> nul(g.rules.size(), 0);
  std::vector<uint32_t> rule_of, left;                // per alternative
  std::vector<std::vector<uint32_t>> used_in(g.rules.size());  // alternatives, once per use
  std::vector<uint32_t> todo;
  for (uint32_t r = 0; r < g.rules.size(); ++r)
    for (const Sequence& s : g.rules[r].alts) {
      const uint32_t a = uint32_t(rule_of.size());
      rule_of.push_back(r);
      const bool chars = std::any_of(s.begin(), s.end(), [](const Symbol& x) { return !x.is_rule; });
      left.push_back(chars ? UINT32_MAX : uint32_t(s.size()));
      if (chars) continue;
      for (const Symbol& x : s) used_in[x.id].push_back(a);
      if (s.empty() && !nul[r]) nul[r] = 1, todo.push_back(r);
    }
  while (!todo.empty()) {
    const uint32_t x = todo.back();
    todo.pop_back();
    for (uint32_t a : used_in[x])
      if (--left[a] == 0 && !nul[rule_of[a]]) nul[rule_of[a]] = 1, todo.push_back(rule_of[a]);
  }
  return nul;
}

// Depth-first over the rules reachable at each rule's start (first[r]),
// without recursion (a long chain must not exhaust the stack): a rule met
// again on the current path is left recursion; the longest path is how
// deep the matcher nests before its first character.
void check_leading_chains(const Grammar& g, const std::vector<std::vector<uint32_t>>& first) {
  enum : char { kNew, kOnPath, kDone };
  std::vector<char> state(g.rules.size(), kNew);
  std::vector<uint32_t> depth(g.rules.size(), 1);
  std::vector<std::pair<uint32_t, size_t>> path;  // (rule, next edge)
  for (uint32_t start = 0; start < g.rules.size(); ++start) {
    if (state[start] != kNew) continue;
    state[start] = kOnPath;
    path.push_back({start, 0});
    while (!path.empty()) {
      auto& [r, e] = path.back();
      if (e < first[r].size()) {
        const uint32_t c = first[r][e++];
        if (state[c] == kOnPath)
          throw GrammarError("grammar: rule '" + g.rules[c].name +
                             "' is left-recursive (it can reach itself before matching a character)");
        if (state[c] == kNew) {
          state[c] = kOnPath;
          path.push_back({c, 0});
        }
        continue;
      }
      for (uint32_t c : first[r]) depth[r] = std::max(depth[r], depth[c] + 1);
      if (depth[r] > Grammar::kMaxLeadingDepth)
        throw GrammarError("grammar: rule '" + g.rules[r].name + "' nests more than " +
                           std::to_string(Grammar::kMaxLeadingDepth) +
                           " rules deep before its first character; flatten the grammar");
      state[r] = kDone;
      path.pop_back();
    }
  }
}

}  // namespace

void validate(const Grammar& g) {
  if (g.rules.empty() || g.root >= g.rules.size()) throw GrammarError("grammar: no root rule");
  if (g.rules.size() > Grammar::kMaxRules) throw GrammarError("grammar: too many rules");
  size_t symbols = 0;
  for (const Rule& r : g.rules) {
    if (r.alts.empty()) throw GrammarError("grammar: rule '" + r.name + "' is used but never defined");
    for (const Sequence& s : r.alts) {
      symbols += s.size();
      for (const Symbol& x : s)
        if ((x.is_rule && x.id >= g.rules.size()) || (!x.is_rule && x.id >= g.classes.size()))
          throw GrammarError("grammar: rule '" + r.name + "' names a symbol that does not exist");
    }
  }
  if (symbols > Grammar::kMaxSymbols) throw GrammarError("grammar: too large");
  // Left recursion: r reaches r through symbols that may all be empty before it.
  const std::vector<char> nul = nullable_rules(g);
  std::vector<std::vector<uint32_t>> first(g.rules.size());  // rules reachable at the start
  for (size_t r = 0; r < g.rules.size(); ++r)
    for (const Sequence& s : g.rules[r].alts)
      for (const Symbol& x : s) {
        if (!x.is_rule) break;
        first[r].push_back(x.id);
        if (!nul[x.id]) break;
      }
  check_leading_chains(g, first);
}

}  // namespace kvs::grammar
