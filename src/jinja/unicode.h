// Code-point view of UTF-8 strings, for the places where Python counts
// characters (len, indexing, slicing, strip, split, case mapping, repr).
// Values hold valid UTF-8 (JSON input and template text are checked).
// Case mapping covers Latin, Greek, Cyrillic and fullwidth Latin, simple
// (one-to-one) mappings plus 'ß' -> "SS"; it omits Python's context rule
// for the final sigma.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvs::jinja::uni {

// Decodes the code point at s[i] and advances i; an invalid byte decodes
// as itself (values are valid UTF-8, so this only guards against misuse).
char32_t next(std::string_view s, size_t& i);
void append(std::string& out, char32_t c);
std::vector<char32_t> decode(std::string_view s);
std::string encode(const std::vector<char32_t>& cps);
size_t length(std::string_view s);  // code points
bool valid_utf8(std::string_view s);

bool is_space(char32_t c);      // str.isspace
bool is_linebreak(char32_t c);  // str.splitlines boundaries
bool is_printable(char32_t c);  // str.isprintable, for repr
bool is_digit(char32_t c);      // decimal digits
bool is_alpha(char32_t c);      // letters (approximate beyond the mapped scripts: CJK etc. count)
bool is_word(char32_t c);       // regex \w
bool is_upper(char32_t c);
bool is_lower(char32_t c);
bool is_cased(char32_t c);

char32_t lower(char32_t c);
char32_t upper(char32_t c);
void append_upper(std::string& out, char32_t c);  // full mapping ('ß' -> "SS")

std::string to_lower(std::string_view s);
std::string to_upper(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize
std::string title(std::string_view s);       // str.title

}  // namespace kvs::jinja::uni
