// Python's two string formatting mini-languages: printf-style `fmt % args`
// (also the format filter) and str.format. A Markup format string escapes
// the plain strings it takes in, as markupsafe does.
#pragma once
#include <string>

#include "jinja/ctx.h"
#include "jinja/value.h"

namespace kvs::jinja {

// fmt % args: a tuple is the positional arguments, a dict the named ones
// (%(name)s), anything else the one argument.
Value percent_format(Ctx& ctx, const Value& fmt, const Value& args);
// fmt.format(*args, **kwargs).
std::string str_format(Ctx& ctx, const std::string& fmt, const Args& args, bool markup);

}  // namespace kvs::jinja
