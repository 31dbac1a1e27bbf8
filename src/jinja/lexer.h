// Template text -> tokens, as Jinja2's lexer does it with trim_blocks and
// lstrip_blocks on (Hugging Face's settings): newlines normalized and one
// trailing newline dropped, `{%-`/`-%}` strip whitespace, a block tag eats
// the newline after it, a block or comment tag alone on its line takes the
// line's indentation with it, `+` turns either off, comments vanish, raw
// blocks are text.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvs::jinja {

enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // data, name, operator, or a string literal's value
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

// Throws Error (Syntax) naming `name` and the line.
std::vector<Token> tokenize(std::string_view source, const std::string& name);

}  // namespace kvs::jinja
