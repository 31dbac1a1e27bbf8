#include "jinja/error.h"

namespace kvs::jinja {

namespace {
std::string describe(const std::string& name, int line, const std::string& message) {
  std::string s = name.empty() ? "template" : name;
  if (line > 0) s += ", line " + std::to_string(line);
  return s + ": " + message;
}
}  // namespace

Error::Error(ErrorKind kind, std::string message, int line, const std::string& name)
    : std::runtime_error(describe(name, line, message)), kind_(kind), line_(line), message_(std::move(message)) {}

}  // namespace kvs::jinja
