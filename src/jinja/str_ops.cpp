#include "jinja/str_ops.h"

#include <algorithm>

#include "jinja/error.h"
#include "jinja/unicode.h"

namespace kvs::jinja::pystr {

std::string strip(std::string_view s, const std::optional<std::string>& chars, Side side) {
  const std::vector<char32_t> cps = uni::decode(s);
  std::vector<char32_t> set;
  if (chars) set = uni::decode(*chars);
  auto drop = [&](char32_t c) { return chars ? std::find(set.begin(), set.end(), c) != set.end() : uni::is_space(c); };
  size_t b = 0, e = cps.size();
  if (side != Side::Right)
    while (b < e && drop(cps[b])) ++b;
  if (side != Side::Left)
    while (e > b && drop(cps[e - 1])) --e;
  return uni::encode(std::vector<char32_t>(cps.begin() + long(b), cps.begin() + long(e)));
}

namespace {

std::vector<std::string> split_space(std::string_view s, int64_t maxsplit, bool from_right) {
  std::vector<char32_t> cps = uni::decode(s);
  if (from_right) std::reverse(cps.begin(), cps.end());
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = cps.size();
  while (true) {
    while (i < n && uni::is_space(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      std::vector<char32_t> rest(cps.begin() + long(i), cps.end());  // the remainder keeps its far end
      if (from_right) std::reverse(rest.begin(), rest.end());
      out.push_back(uni::encode(rest));
      break;
    }
    size_t j = i;
    while (j < n && !uni::is_space(cps[j])) ++j;
    std::vector<char32_t> word(cps.begin() + long(i), cps.begin() + long(j));
    if (from_right) std::reverse(word.begin(), word.end());
    out.push_back(uni::encode(word));
    i = j;
  }
  if (from_right) std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (!sep) return split_space(s, maxsplit, false);
  if (sep->empty()) throw EvalError("ValueError: empty separator");
  std::vector<std::string> out;
  size_t pos = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    const size_t at = s.find(*sep, pos);
    if (at == std::string_view::npos) break;
    out.emplace_back(s.substr(pos, at - pos));
    pos = at + sep->size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (!sep) return split_space(s, maxsplit, true);
  if (sep->empty()) throw EvalError("ValueError: empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    const size_t at = s.rfind(*sep, end - sep->size());
    if (at == std::string_view::npos) break;
    out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
    end = at;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const char32_t c = uni::next(s, i);
    if (!uni::is_linebreak(c)) continue;
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    out.emplace_back(s.substr(start, (keepends ? i : at) - start));
    start = i;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    // Python inserts the replacement before every character and at the end.
    size_t i = 0;
    while (i <= s.size()) {
      if (count >= 0 && done >= count) {
        out.append(s.substr(i));
        break;
      }
      out.append(repl);
      ++done;
      if (i == s.size()) break;
      const size_t from = i;
      uni::next(s, i);
      out.append(s.substr(from, i - from));
    }
    return out;
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos));
    out.append(repl);
    pos = at + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

namespace {

// Byte offsets of each code point, plus the end.
std::vector<size_t> offsets(std::string_view s) {
  std::vector<size_t> o;
  for (size_t i = 0; i < s.size();) {
    o.push_back(i);
    uni::next(s, i);
  }
  o.push_back(s.size());
  return o;
}

int64_t clamp_index(std::optional<int64_t> v, int64_t n, int64_t dflt) {
  if (!v) return dflt;
  int64_t x = *v;
  if (x < 0) x = std::max<int64_t>(0, x + n);
  return std::min(x, n);
}

}  // namespace

int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
             bool reverse) {
  const std::vector<size_t> o = offsets(s);
  const int64_t n = int64_t(o.size()) - 1;
  const int64_t b = clamp_index(start, n, 0), e = clamp_index(end, n, n);
  if (b > e) return -1;
  const std::string_view part = s.substr(o[size_t(b)], o[size_t(e)] - o[size_t(b)]);
  const size_t at = reverse ? part.rfind(sub) : part.find(sub);
  if (at == std::string_view::npos) return -1;
  const size_t byte = o[size_t(b)] + at;
  return int64_t(std::lower_bound(o.begin(), o.end(), byte) - o.begin());
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return int64_t(uni::length(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

std::string cp_slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> end) {
  const std::vector<size_t> o = offsets(s);
  const int64_t n = int64_t(o.size()) - 1;
  const int64_t b = clamp_index(start, n, 0), e = clamp_index(end, n, n);
  if (b >= e) return "";
  return std::string(s.substr(o[size_t(b)], o[size_t(e)] - o[size_t(b)]));
}

std::string pad(std::string_view s, int64_t width, std::string_view fill, int align) {
  const int64_t len = int64_t(uni::length(s));
  if (width <= len) return std::string(s);
  const int64_t total = width - len;
  int64_t left = align < 0 ? 0 : align > 0 ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

std::string zfill(std::string_view s, int64_t width) {
  const int64_t len = int64_t(uni::length(s));
  if (width <= len) return std::string(s);
  std::string zeros(size_t(width - len), '0');
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) return std::string(1, s[0]) + zeros + std::string(s.substr(1));
  return zeros + std::string(s);
}

}  // namespace kvs::jinja::pystr
