// Python's str algorithms on UTF-8 text (positions are code points where
// Python's are): strip, split, splitlines, replace, find, count, padding.
// Shared by the string methods and the filters.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs::jinja::pystr {

enum class Side { Both, Left, Right };
// str.strip(chars); nullopt chars = whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, Side side = Side::Both);
// str.split(sep, maxsplit) / rsplit; nullopt sep = runs of whitespace.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
// str.replace(old, new, count); count < 0 = all.
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
// Code-point index of the first / last occurrence in s[start:end], or -1.
int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
             bool reverse);
int64_t count(std::string_view s, std::string_view sub);
// s[start:end] in code points, Python slice rules for negative and large bounds.
std::string cp_slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> end);
// str.center / ljust / rjust with a one-character fill.
std::string pad(std::string_view s, int64_t width, std::string_view fill, int align /* -1 left, 0 center, 1 right */);
std::string zfill(std::string_view s, int64_t width);

}  // namespace kvs::jinja::pystr
