#include "jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "jinja/error.h"
#include "jinja/unicode.h"

namespace kvs::jinja {

namespace {

// Python's \s at s[i]: its length in bytes, 0 when not whitespace.
size_t space_at(std::string_view s, size_t i) {
  size_t j = i;
  const char32_t c = uni::next(s, j);
  return uni::is_space(c) ? j - i : 0;
}

size_t skip_spaces(std::string_view s, size_t i) {
  while (i < s.size()) {
    const size_t n = space_at(s, i);
    if (!n) break;
    i += n;
  }
  return i;
}

std::string rstrip_spaces(std::string_view s) {
  std::vector<char32_t> cps = uni::decode(s);
  while (!cps.empty() && uni::is_space(cps.back())) cps.pop_back();
  return uni::encode(cps);
}

bool all_spaces(std::string_view s) { return !s.empty() && skip_spaces(s, 0) == s.size(); }

int count_newlines(std::string_view s) { return int(std::count(s.begin(), s.end(), '\n')); }

std::string normalize(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

bool is_name_start(unsigned char c) { return std::isalpha(c) || c == '_' || c >= 0x80; }
bool is_name_char(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& name) : s_(normalize(src)), name_(name) {}
  std::vector<Token> run();

 private:
  [[noreturn]] void fail(const std::string& m) const { throw Error(ErrorKind::Syntax, m, line_, name_); }
  void emit(Tok t, std::string text = {}) {
    Token k;
    k.type = t;
    k.text = std::move(text);
    k.line = line_;
    out_.push_back(std::move(k));
  }
  // Emits the text before a tag after whitespace control; `sign` is the
  // tag's '-', '+' or 0; lstrip applies to block and comment tags only.
  void text_before(std::string_view text, char sign, bool lstrip);
  // Block or variable end at pos_: its length (with the whitespace it eats), 0 if none.
  size_t end_at(bool block) const;
  void tag(bool block);
  void comment();
  bool raw(size_t at, size_t open_end, char sign);
  void token();
  void number_or_name();
  void string_literal();

  std::string s_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
  std::vector<char> brackets_;
};

void Lexer::text_before(std::string_view text, char sign, bool lstrip) {
  std::string t(text);
  if (sign == '-') {
    t = rstrip_spaces(text);
  } else if (sign != '+' && lstrip) {
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && all_spaces(text.substr(l_pos))) t = std::string(text.substr(0, l_pos));
  }
  if (!t.empty()) emit(Tok::Data, t);
  line_ += count_newlines(text);
}

std::vector<Token> Lexer::run() {
  while (pos_ < s_.size()) {
    size_t at = pos_;
    char kind = 0;
    while ((at = s_.find('{', at)) != std::string::npos) {
      if (at + 1 < s_.size() && std::strchr("{%#", s_[at + 1])) {
        kind = s_[at + 1];
        break;
      }
      ++at;
    }
    if (!kind) {
      emit(Tok::Data, s_.substr(pos_));
      break;
    }
    const char sign = at + 2 < s_.size() && (s_[at + 2] == '-' || s_[at + 2] == '+') ? s_[at + 2] : 0;
    const size_t open_end = at + 2 + (sign ? 1 : 0);
    const std::string_view text = std::string_view(s_).substr(pos_, at - pos_);
    if (kind == '%' && raw(at, open_end, sign)) continue;
    text_before(text, sign, kind != '{');
    pos_ = open_end;
    line_starting_ = false;
    if (kind == '#')
      comment();
    else
      tag(kind == '%');
  }
  emit(Tok::Eof);
  return std::move(out_);
}

void Lexer::comment() {
  for (size_t j = pos_; j < s_.size(); ++j) {
    size_t end = 0;
    if (s_.compare(j, 3, "+#}") == 0)
      end = j + 3;
    else if (s_.compare(j, 3, "-#}") == 0)
      end = skip_spaces(s_, j + 3);
    else if (s_.compare(j, 2, "#}") == 0)
      end = j + 2 + (j + 2 < s_.size() && s_[j + 2] == '\n');
    if (!end) continue;
    line_ += count_newlines(std::string_view(s_).substr(pos_, end - pos_));
    line_starting_ = s_[end - 1] == '\n';
    pos_ = end;
    return;
  }
  fail("Missing end of comment tag");
}

bool Lexer::raw(size_t at, size_t open_end, char sign) {
  // {% raw %} ... {% endraw %}: the body is text, whitespace-controlled like
  // the text before a tag.
  size_t i = skip_spaces(s_, open_end);
  if (s_.compare(i, 3, "raw") != 0) return false;
  i = skip_spaces(s_, i + 3);
  size_t body;
  if (s_.compare(i, 3, "-%}") == 0)
    body = skip_spaces(s_, i + 3);
  else if (s_.compare(i, 2, "%}") == 0)
    body = i + 2;
  else
    return false;
  text_before(std::string_view(s_).substr(pos_, at - pos_), sign, true);
  line_ += count_newlines(std::string_view(s_).substr(open_end, body - open_end));
  line_starting_ = s_[body - 1] == '\n';
  for (size_t j = body; (j = s_.find("{%", j)) != std::string::npos; ++j) {
    const char esign = j + 2 < s_.size() && (s_[j + 2] == '-' || s_[j + 2] == '+') ? s_[j + 2] : 0;
    size_t k = skip_spaces(s_, j + 2 + (esign ? 1 : 0));
    if (s_.compare(k, 6, "endraw") != 0) continue;
    k = skip_spaces(s_, k + 6);
    size_t end;
    if (s_.compare(k, 3, "+%}") == 0)
      end = k + 3;
    else if (s_.compare(k, 3, "-%}") == 0)
      end = skip_spaces(s_, k + 3);
    else if (s_.compare(k, 2, "%}") == 0)
      end = k + 2 + (k + 2 < s_.size() && s_[k + 2] == '\n');
    else
      continue;
    text_before(std::string_view(s_).substr(body, j - body), esign, true);
    line_ += count_newlines(std::string_view(s_).substr(j, end - j));
    line_starting_ = s_[end - 1] == '\n';
    pos_ = end;
    return true;
  }
  fail("Missing end of raw directive");
}

size_t Lexer::end_at(bool block) const {
  const std::string_view s = s_;
  if (block) {
    if (s.compare(pos_, 3, "+%}") == 0) return 3;
    if (s.compare(pos_, 3, "-%}") == 0) return skip_spaces(s, pos_ + 3) - pos_;
    if (s.compare(pos_, 2, "%}") == 0) return 2 + (pos_ + 2 < s.size() && s[pos_ + 2] == '\n');
    return 0;
  }
  if (s.compare(pos_, 3, "-}}") == 0) return skip_spaces(s, pos_ + 3) - pos_;
  if (s.compare(pos_, 2, "}}") == 0) return 2;
  return 0;
}

void Lexer::tag(bool block) {
  emit(block ? Tok::BlockBegin : Tok::VarBegin);
  brackets_.clear();
  while (pos_ < s_.size()) {
    if (brackets_.empty()) {
      if (const size_t n = end_at(block)) {
        emit(block ? Tok::BlockEnd : Tok::VarEnd);
        line_ += count_newlines(std::string_view(s_).substr(pos_, n));
        pos_ += n;
        line_starting_ = s_[pos_ - 1] == '\n';
        return;
      }
    }
    if (const size_t n = space_at(s_, pos_)) {
      line_ += s_[pos_] == '\n';
      pos_ += n;
      continue;
    }
    token();
  }
  fail(std::string("unexpected end of template: the tag opened here is not closed with '") + (block ? "%}" : "}}") +
       "'");
}

void Lexer::token() {
  const unsigned char c = static_cast<unsigned char>(s_[pos_]);
  if (std::isdigit(c) || is_name_start(c)) return number_or_name();
  if (c == '\'' || c == '"') return string_literal();
  static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                               "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
  for (const char* op : kOps) {
    const size_t n = std::strlen(op);
    if (s_.compare(pos_, n, op) != 0) continue;
    const char o = op[0];
    if (n == 1 && (o == '(' || o == '[' || o == '{')) brackets_.push_back(o == '(' ? ')' : o == '[' ? ']' : '}');
    if (n == 1 && (o == ')' || o == ']' || o == '}')) {
      if (brackets_.empty()) fail(std::string("unexpected '") + o + "'");
      if (brackets_.back() != o) fail(std::string("unexpected '") + o + "', expected '" + brackets_.back() + "'");
      brackets_.pop_back();
    }
    emit(Tok::Op, op);
    pos_ += n;
    return;
  }
  std::string ch;
  size_t j = pos_;
  uni::append(ch, uni::next(s_, j));
  fail("unexpected char '" + ch + "' at " + std::to_string(pos_));
}

void Lexer::number_or_name() {
  const std::string_view s = s_;
  auto dig = [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; };
  auto digits = [&](size_t i) {
    // (\d+_)*\d+ runs: digits with single underscores between them.
    size_t j = i;
    while (j < s.size() && (dig(s[j]) || (s[j] == '_' && j > i && j + 1 < s.size() && dig(s[j + 1])))) ++j;
    return j;
  };
  auto strip = [](std::string_view t) {
    std::string r;
    for (char ch : t)
      if (ch != '_') r += ch;
    return r;
  };
  if (std::isdigit(static_cast<unsigned char>(s[pos_])) && (pos_ == 0 || s[pos_ - 1] != '.')) {
    // Float first (as Jinja2's rule order): digits, then a fraction and/or an exponent.
    size_t j = digits(pos_);
    size_t k = j;
    bool frac = false, expo = false;
    if (k + 1 < s.size() && s[k] == '.' && std::isdigit(static_cast<unsigned char>(s[k + 1]))) {
      k = digits(k + 1);
      frac = true;
    }
    if (k < s.size() && (s[k] == 'e' || s[k] == 'E')) {
      size_t e = k + 1;
      if (e < s.size() && (s[e] == '+' || s[e] == '-')) ++e;
      if (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) {
        k = digits(e);
        expo = true;
      }
    }
    if (frac || expo) {
      emit(Tok::Float, std::string(s.substr(pos_, k - pos_)));
      out_.back().f = std::stod(strip(s.substr(pos_, k - pos_)));
      pos_ = k;
      return;
    }
  }
  if (std::isdigit(static_cast<unsigned char>(s[pos_]))) {
    int base = 10;
    size_t b = pos_;
    if (s[pos_] == '0' && pos_ + 1 < s.size() && std::strchr("bBoOxX", s[pos_ + 1]) && pos_ + 2 < s.size()) {
      base = std::tolower(static_cast<unsigned char>(s[pos_ + 1])) == 'b' ? 2
             : std::tolower(s[pos_ + 1]) == 'o'                           ? 8
                                                                          : 16;
      b = pos_ + 2;
    }
    size_t j = b;
    auto ok = [&](char ch) {
      const int d = std::isdigit(static_cast<unsigned char>(ch))    ? ch - '0'
                    : std::isxdigit(static_cast<unsigned char>(ch)) ? std::tolower(ch) - 'a' + 10
                                                                    : 99;
      return d < base;
    };
    while (j < s.size() && (ok(s[j]) || (s[j] == '_' && j + 1 < s.size() && ok(s[j + 1])))) ++j;
    if (base == 10 && s[pos_] == '0') {  // "0(_?0)*": a decimal literal may not start with 0
      j = pos_ + 1;
      while (j < s.size() && (s[j] == '0' || (s[j] == '_' && j + 1 < s.size() && s[j + 1] == '0'))) ++j;
    }
    if (j == b) j = pos_ + 1, base = 10;  // "0x" without digits: the 0 alone
    const std::string t = strip(s.substr(b, j - b));
    errno = 0;
    const unsigned long long v = std::strtoull(t.empty() ? "0" : t.c_str(), nullptr, base);
    if (errno == ERANGE || v > uint64_t(INT64_MAX)) fail("integer literal out of the 64-bit range");
    emit(Tok::Int, std::string(s.substr(pos_, j - pos_)));
    out_.back().i = int64_t(v);
    pos_ = j;
    return;
  }
  size_t j = pos_;
  while (j < s.size() && is_name_char(static_cast<unsigned char>(s[j]))) ++j;
  emit(Tok::Name, std::string(s.substr(pos_, j - pos_)));
  pos_ = j;
}

void Lexer::string_literal() {
  const char q = s_[pos_];
  std::string value;
  size_t i = pos_ + 1;
  const int start_line = line_;
  auto hex = [&](size_t at, int n) -> char32_t {
    if (at + size_t(n) > s_.size()) fail("truncated escape in string literal");
    char32_t v = 0;
    for (int k = 0; k < n; ++k) {
      const char c = s_[at + size_t(k)];
      if (!std::isxdigit(static_cast<unsigned char>(c))) fail("truncated \\x, \\u or \\U escape in string literal");
      v = v * 16 + char32_t(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
    }
    return v;
  };
  while (true) {
    if (i >= s_.size()) fail("unexpected end of template in a string literal");
    const char c = s_[i];
    if (c == q) break;
    if (c == '\n') ++line_;
    if (c != '\\') {
      value += c;
      ++i;
      continue;
    }
    if (i + 1 >= s_.size()) fail("unexpected end of template in a string literal");
    const char e = s_[i + 1];
    i += 2;
    switch (e) {
      case '\n': ++line_; break;  // line continuation
      case '\\': value += '\\'; break;
      case '\'': value += '\''; break;
      case '"': value += '"'; break;
      case 'a': value += '\a'; break;
      case 'b': value += '\b'; break;
      case 'f': value += '\f'; break;
      case 'n': value += '\n'; break;
      case 'r': value += '\r'; break;
      case 't': value += '\t'; break;
      case 'v': value += '\v'; break;
      case 'x':
        uni::append(value, hex(i, 2));
        i += 2;
        break;
      case 'u':
        uni::append(value, hex(i, 4));
        i += 4;
        break;
      case 'U': {
        const char32_t v = hex(i, 8);
        if (v > 0x10ffff) fail("illegal Unicode character in string literal");
        uni::append(value, v);
        i += 8;
        break;
      }
      case 'N': fail("\\N{...} escapes are not supported");
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = char32_t(e - '0');
          for (int k = 0; k < 2 && i < s_.size() && s_[i] >= '0' && s_[i] <= '7'; ++k)
            v = v * 8 + char32_t(s_[i++] - '0');
          uni::append(value, v);
        } else {
          value += '\\';  // an unknown escape stays as written
          value += e;
          if (e == '\n') ++line_;
        }
    }
  }
  const int end_line = line_;
  line_ = start_line;
  emit(Tok::String, std::move(value));
  line_ = end_line;
  pos_ = i + 1;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source, const std::string& name) {
  if (!uni::valid_utf8(source)) throw Error(ErrorKind::Syntax, "the template is not valid UTF-8", 0, name);
  return Lexer(source, name).run();
}

}  // namespace kvs::jinja
