// The global functions a template can call: Jinja2's range (capped as the
// sandbox caps it), dict, namespace, joiner, cycler, and Hugging Face's
// raise_exception and strftime_now.
#pragma once
#include <string>

#include "jinja/value.h"

namespace kvs::jinja {

// The global `name`, or nullptr. The values are shared by all renders.
const Value* find_builtin(const std::string& name);

}  // namespace kvs::jinja
