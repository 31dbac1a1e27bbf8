// Reads a call's arguments by position or keyword, as a Python signature
// would bind them, with TypeErrors for too many or unknown arguments.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "jinja/value.h"

namespace kvs::jinja {

// TypeError when a function that takes no arguments gets some.
void no_args(const char* fn, const Args& args);

class ArgReader {
 public:
  // `params`: the parameter names in order; the first `skip` positional
  // arguments are already bound (a filter's input).
  ArgReader(std::string fn, const Args& args, std::initializer_list<const char*> params);
  // The argument bound to parameter `i`, or nullptr when not given.
  const Value* get(size_t i) const { return bound_[i]; }
  Value get_or(size_t i, Value dflt) const { return bound_[i] ? *bound_[i] : std::move(dflt); }
  bool has(size_t i) const { return bound_[i] != nullptr; }
  // The argument as an integer / string, TypeError otherwise.
  int64_t int_or(size_t i, int64_t dflt) const;
  std::string str_or(size_t i, const std::string& dflt) const;
  bool bool_or(size_t i, bool dflt) const;  // truthiness

 private:
  std::string fn_;
  std::vector<const Value*> bound_;
};

}  // namespace kvs::jinja
