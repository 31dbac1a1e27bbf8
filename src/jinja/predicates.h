// Jinja2's tests (`x is defined`, `x is divisibleby 3`; jinja2/tests.py).
#pragma once
#include <string>

#include "jinja/ctx.h"
#include "jinja/value.h"

namespace kvs::jinja {

using TestFn = bool (*)(Ctx& ctx, const Value& v, const Args& args);

bool has_test(const std::string& name);
TestFn find_test(const std::string& name);  // nullptr when unknown

}  // namespace kvs::jinja
