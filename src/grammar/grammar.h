// A context-free grammar over Unicode code points, in the form the matcher
// walks: rules of alternatives, each a sequence of symbols that are either
// a character class or a reference to another rule. GBNF text (llama.cpp's
// grammar format, gbnf.h) and JSON schemas (json_schema.h) compile to it.
// Immutable once built; shared by every sequence that decodes under it.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvs::grammar {

struct CharRange {
  uint32_t lo, hi;  // inclusive
};

// [a-z0-9_], [^"\\], or . (any character).
struct CharClass {
  std::vector<CharRange> ranges;
  bool negated = false;
  bool matches(uint32_t cp) const;
  // Whether some code point in [lo, hi] matches (partial UTF-8 checks).
  bool matches_any(uint32_t lo, uint32_t hi) const;
};

struct Symbol {
  bool is_rule = false;
  uint32_t id = 0;  // rule index, or class index
};

using Sequence = std::vector<Symbol>;  // may be empty (epsilon)

struct Rule {
  std::string name;
  std::vector<Sequence> alts;
};

struct Grammar {
  std::vector<Rule> rules;
  std::vector<CharClass> classes;
  uint32_t root = 0;
  // Bounds checked at build time; the matcher relies on them.
  static constexpr size_t kMaxRules = 1 << 16;
  static constexpr size_t kMaxSymbols = 1 << 20;
  // Rules one inside another before a first character can match (the
  // matcher expands them recursively).
  static constexpr uint32_t kMaxLeadingDepth = 1000;
};

// Bad grammar text or a schema kvserve cannot constrain to; the message
// names the place (line:column, or the schema keyword).
class GrammarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws GrammarError when a rule is referenced but not defined, the root
// is missing, a rule can reach itself without consuming a character (left
// recursion: the matcher would never terminate), or rules nest more than
// kMaxLeadingDepth deep before a character. Linear in the grammar's size.
void validate(const Grammar& g);

}  // namespace kvs::grammar
