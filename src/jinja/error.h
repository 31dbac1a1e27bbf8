// Errors of the template engine. A template that does not parse, a render
// that fails (a type error, an undefined value used, raise_exception) and a
// render that passes one of the limits are all an Error naming the
// template and its line; nothing the template does crashes the caller.
#pragma once
#include <stdexcept>
#include <string>

namespace kvs::jinja {

enum class ErrorKind {
  Syntax,  // the template does not parse (or names a filter or test that does not exist)
  Render,  // the render failed: a type error, an undefined value used, ...
  Raised,  // the template called raise_exception(message)
  Limit,   // the render passed one of the Limits
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, int line, const std::string& name);
  ErrorKind kind() const { return kind_; }
  int line() const { return line_; }  // 1-based; 0 when unknown
  // The message alone, without the template's name and line.
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_;
  int line_;
  std::string message_;
};

// What values, filters and calls throw while rendering; the interpreter adds
// the line of the expression being evaluated and turns it into an Error.
class EvalError : public std::runtime_error {
 public:
  explicit EvalError(const std::string& message, ErrorKind kind = ErrorKind::Render)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace kvs::jinja
