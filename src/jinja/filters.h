// Jinja2's built-in filters (jinja2/filters.py), plus Hugging Face's
// tojson, with their argument names and defaults. Filters that return
// generators in Jinja2 (select, map, unique, items, reverse, ...) return
// Generator values here, so that their quirks (one pass, no length, always
// true) are the same.
#pragma once
#include <string>

#include "jinja/ctx.h"
#include "jinja/value.h"

namespace kvs::jinja {

using FilterFn = Value (*)(Ctx& ctx, const Value& v, const Args& args);

bool has_filter(const std::string& name);
FilterFn find_filter(const std::string& name);  // nullptr when unknown

// Jinja2's make_attrgetter: "a.b.0" looked up item by item; `dflt` replaces
// an undefined result when given.
Value attr_path(const Value& v, const std::string& path, const Value* dflt = nullptr);

}  // namespace kvs::jinja
