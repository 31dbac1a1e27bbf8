#include "grammar/gbnf.h"

#include <unordered_map>

namespace kvs::grammar {

namespace {

constexpr int kMaxRepeat = 4096;

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view t) : t_(t) {}

  Grammar run(std::string_view root) {
    skip();
    while (i_ < t_.size()) parse_rule();
    auto it = ids_.find(std::string(root));
    if (it == ids_.end()) throw GrammarError("grammar: no rule named '" + std::string(root) + "'");
    g_.root = it->second;
    validate(g_);
    return std::move(g_);
  }

 private:
  std::string_view t_;
  size_t i_ = 0;
  Grammar g_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<char> defined_;
  int depth_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < t_.size(); ++k) {
      if (t_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError("grammar: line " + std::to_string(line) + ":" + std::to_string(col) + ": " + what);
  }
  void skip() {
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == '#') {
        while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else {
        break;
      }
    }
  }
  bool at(char c) const { return i_ < t_.size() && t_[i_] == c; }
  std::string name() {
    const size_t b = i_;
    while (i_ < t_.size() && name_char(t_[i_])) ++i_;
    if (i_ == b) fail("expected a rule name");
    return std::string(t_.substr(b, i_ - b));
  }
  // A `name ::=` starts here (the next rule).
  bool rule_start() const {
    size_t k = i_;
    while (k < t_.size() && name_char(t_[k])) ++k;
    if (k == i_) return false;
    while (k < t_.size() && (t_[k] == ' ' || t_[k] == '\t' || t_[k] == '\n' || t_[k] == '\r')) ++k;
    return t_.substr(k, 3) == "::=";
  }
  uint32_t rule_id(const std::string& n) {
    auto [it, fresh] = ids_.try_emplace(n, uint32_t(g_.rules.size()));
    if (fresh) {
      g_.rules.push_back({n, {}});
      defined_.push_back(0);
    }
    return it->second;
  }
  uint32_t new_rule(const std::string& base) {
    if (g_.rules.size() >= Grammar::kMaxRules) fail("too many rules (repetition counts too large?)");
    return rule_id(base + "~" + std::to_string(g_.rules.size()));
  }
  uint32_t add_class(CharClass c) {
    g_.classes.push_back(std::move(c));
    return uint32_t(g_.classes.size() - 1);
  }

  void parse_rule() {
    const std::string n = name();
    skip();
    if (t_.substr(i_, 3) != "::=") fail("expected '::=' after rule name '" + n + "'");
    i_ += 3;
    const uint32_t r = rule_id(n);
    if (defined_[r]) fail("rule '" + n + "' is defined twice");
    defined_[r] = 1;
    g_.rules[r].alts = alternatives(false);
  }

  std::vector<Sequence> alternatives(bool in_group) {
    std::vector<Sequence> alts;
    alts.push_back(sequence(in_group));
    while (at('|')) {
      ++i_;
      alts.push_back(sequence(in_group));
    }
    return alts;
  }

  Sequence sequence(bool in_group) {
    Sequence seq;
    skip();
    while (i_ < t_.size() && !at('|') && !(in_group && at(')'))) {
      if (!in_group && rule_start()) break;
      if (at(')')) fail("unbalanced ')'");
      const size_t before = seq.size();
      primary(seq);
      skip();
      repeat(seq, before);
      skip();
    }
    return seq;
  }

  void primary(Sequence& seq) {
    const char c = t_[i_];
    if (c == '"') return literal(seq);
    if (c == '[') return seq.push_back({false, char_class()});
    if (c == '.') {
      ++i_;
      return seq.push_back({false, add_class({{}, true})});
    }
    if (c == '(') {
      if (++depth_ > 64) fail("groups nested too deeply");
      ++i_;
      const uint32_t r = new_rule("group");
      auto alts = alternatives(true);
      if (!at(')')) fail("expected ')'");
      ++i_;
      --depth_;
      g_.rules[r].alts = std::move(alts);
      defined_[r] = 1;
      return seq.push_back({true, r});
    }
    if (name_char(c)) return seq.push_back({true, rule_id(name())});
    fail(std::string("unexpected character '") + c + "'");
  }

  uint32_t code_point(bool in_class);
  void literal(Sequence& seq);
  uint32_t char_class();
  void repeat(Sequence& seq, size_t first);
  int number();
};

// One character of a literal or class, escapes decoded, UTF-8 read whole.
uint32_t Parser::code_point(bool in_class) {
  if (i_ >= t_.size()) fail("unterminated literal");
  unsigned char c = static_cast<unsigned char>(t_[i_]);
  if (c == '\\') {
    if (++i_ >= t_.size()) fail("unterminated escape");
    const char e = t_[i_++];
    auto hex = [&](int n) {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k, ++i_) {
        if (i_ >= t_.size()) fail("short hex escape");
        const char h = t_[i_];
        const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) fail("bad hex digit in escape");
        v = v * 16 + uint32_t(d);
      }
      if (v > 0x10FFFF) fail("escape beyond U+10FFFF");
      return v;
    };
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case '\\': case '"': case '[': case ']': case '-': case '/': return uint32_t(e);
      default: fail(std::string("unknown escape '\\") + e + "'");
    }
  }
  if (!in_class && c == '\n') fail("newline in a literal (write \\n)");
  // UTF-8: lead byte and continuation bytes.
  const int len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (len == 0 || i_ + size_t(len) > t_.size()) fail("invalid UTF-8");
  uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
  for (int k = 1; k < len; ++k) {
    const unsigned char b = static_cast<unsigned char>(t_[i_ + size_t(k)]);
    if ((b & 0xC0) != 0x80) fail("invalid UTF-8");
    cp = (cp << 6) | (b & 0x3F);
  }
  i_ += size_t(len);
  return cp;
}

void Parser::literal(Sequence& seq) {
  ++i_;  // "
  while (!at('"')) {
    if (i_ >= t_.size()) fail("unterminated literal");
    const uint32_t cp = code_point(false);
    seq.push_back({false, add_class({{{cp, cp}}, false})});
  }
  ++i_;
}

uint32_t Parser::char_class() {
  ++i_;  // [
  CharClass cc;
  if (at('^')) {
    cc.negated = true;
    ++i_;
  }
  while (!at(']')) {
    if (i_ >= t_.size()) fail("unterminated character class");
    const uint32_t lo = code_point(true);
    uint32_t hi = lo;
    if (at('-') && i_ + 1 < t_.size() && t_[i_ + 1] != ']') {
      ++i_;
      hi = code_point(true);
      if (hi < lo) fail("character range out of order");
    }
    cc.ranges.push_back({lo, hi});
  }
  ++i_;
  return add_class(std::move(cc));
}

int Parser::number() {
  skip();
  const size_t b = i_;
  int v = 0;
  while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
    v = v * 10 + (t_[i_++] - '0');
    if (v > kMaxRepeat) fail("repetition count over " + std::to_string(kMaxRepeat));
  }
  if (i_ == b) fail("expected a number");
  skip();
  return v;
}

// The operator after a primary applies to the symbols it produced (one, or
// a literal's characters, which become a group first).
void Parser::repeat(Sequence& seq, size_t first) {
  if (!(at('*') || at('+') || at('?') || at('{'))) return;
  Symbol x = seq[first];
  if (seq.size() - first > 1) {
    const uint32_t r = new_rule("lit");
    g_.rules[r].alts = {Sequence(seq.begin() + std::ptrdiff_t(first), seq.end())};
    defined_[r] = 1;
    x = {true, r};
  }
  seq.resize(first);
  auto star = [&]() {
    const uint32_t r = new_rule("star");
    g_.rules[r].alts = {{x, {true, r}}, {}};
    defined_[r] = 1;
    return Symbol{true, r};
  };
  auto optional_chain = [&](int k) {  // up to k more x
    Symbol tail{};
    bool have = false;
    for (int j = 0; j < k; ++j) {
      const uint32_t r = new_rule("opt");
      g_.rules[r].alts = {have ? Sequence{x, tail} : Sequence{x}, {}};
      defined_[r] = 1;
      tail = {true, r};
      have = true;
    }
    if (have) seq.push_back(tail);
  };
  const char op = t_[i_++];
  if (op == '*') return seq.push_back(star());
  if (op == '+') {
    seq.push_back(x);
    return seq.push_back(star());
  }
  if (op == '?') return optional_chain(1);
  const int m = number();
  int n = m;
  bool open = false;
  if (at(',')) {
    ++i_;
    skip();
    if (at('}')) open = true;
    else n = number();
  }
  if (!at('}')) fail("expected '}'");
  ++i_;
  if (!open && n < m) fail("repetition {m,n} with n < m");
  for (int j = 0; j < m; ++j) seq.push_back(x);
  if (open) seq.push_back(star());
  else optional_chain(n - m);
}

}  // namespace

Grammar parse_gbnf(std::string_view text, std::string_view root) { return Parser(text).run(root); }

}  // namespace kvs::grammar
