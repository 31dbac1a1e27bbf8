// The methods of str, dict and list values that templates call
// ('x'.strip(), d.items(), d.get(k)). As in Jinja2's immutable sandbox, the
// methods that would change a list or dict exist but are refused: they
// come back as an undefined value whose call raises a SecurityError.
#pragma once
#include <optional>
#include <string>

#include "jinja/value.h"

namespace kvs::jinja {

// self.name as a bound method; nullopt when self's type has no such method.
std::optional<Value> method_of(const Value& self, const std::string& name);

}  // namespace kvs::jinja
