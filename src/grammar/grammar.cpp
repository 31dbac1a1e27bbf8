#include "grammar/grammar.h"

#include <algorithm>

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

// Which rules can derive the empty string.
std::vector<char> nullable_rules(const Grammar& g) {
  std::vector<char> nul(g.rules.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.rules.size(); ++r) {
      if (nul[r]) continue;
      for (const Sequence& s : g.rules[r].alts) {
        const bool all = std::all_of(s.begin(), s.end(), [&](const Symbol& x) { return x.is_rule && nul[x.id]; });
        if (all) {
          nul[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  return nul;
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
  for (size_t start = 0; start < g.rules.size(); ++start) {
    std::vector<char> seen(g.rules.size(), 0);
    std::vector<uint32_t> todo = first[start];
    while (!todo.empty()) {
      const uint32_t r = todo.back();
      todo.pop_back();
      if (r == start)
        throw GrammarError("grammar: rule '" + g.rules[start].name +
                           "' is left-recursive (it can reach itself before matching a character)");
      if (seen[r]) continue;
      seen[r] = 1;
      todo.insert(todo.end(), first[r].begin(), first[r].end());
    }
  }
}

}  // namespace kvs::grammar
