// Values as Python prints them: str() for {{ }}, ~ and the string filter,
// repr() inside lists and dicts, float repr (shortest round trip), and
// markupsafe's HTML escape.
#pragma once
#include <string>

#include "jinja/value.h"

namespace kvs::jinja {

std::string py_str(const Value& v);             // str(v); undefined -> ""
std::string py_repr(const Value& v);            // repr(v)
std::string float_repr(double d);               // repr(float): "1.0", "1e+20", "1.5e-05", "inf", "nan"
std::string string_repr(const std::string& s);  // repr(str): quotes and escapes as Python
std::string html_escape(const std::string& s);  // & < > " ' -> &amp; &lt; &gt; &#34; &#39;
// markupsafe.escape: a Markup stays as it is, anything else is str() then escaped.
Value escape(const Value& v);

}  // namespace kvs::jinja
