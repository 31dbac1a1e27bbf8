// Tokens -> the template's AST, with Jinja2's grammar and operator
// precedence. A filter or test name that does not exist is a syntax error,
// except inside an if statement or an inline if, where Jinja2 defers it to
// the render (so a branch not taken may name one).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace kvs::jinja {

struct ParseLimits {
  int max_nesting = 200;  // nested statements, brackets and operator chains
};

// Throws Error (Syntax) naming `name` and the line.
std::unique_ptr<Program> parse(std::vector<Token> tokens, const std::string& name, const ParseLimits& limits = {});

}  // namespace kvs::jinja
