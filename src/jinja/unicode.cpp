#include "jinja/unicode.h"

namespace kvs::jinja::uni {

char32_t next(std::string_view s, size_t& i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + size_t(n) > s.size()) {
    ++i;
    return c;
  }
  if (n == 1) {
    ++i;
    return c;
  }
  char32_t cp = c & (0x7f >> n);
  for (int k = 1; k < n; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + size_t(k)]);
    if ((d >> 6) != 2) {
      ++i;
      return c;
    }
    cp = (cp << 6) | (d & 0x3f);
  }
  i += size_t(n);
  return cp;
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xc0 | (c >> 6));
    out += char(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += char(0xe0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  } else {
    out += char(0xf0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3f));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  }
}

std::vector<char32_t> decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(next(s, i));
  return out;
}

std::string encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) append(out, c);
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + size_t(n) > s.size()) return false;
    char32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (int k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static const char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += size_t(n);
  }
  return true;
}

bool is_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool is_linebreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

bool is_printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x2064) ||
      (c >= 0x2066 && c <= 0x206f) || c == 0x3000)
    return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61c || c == 0x6dd || c == 0x70f || c == 0x180e || c == 0xfeff ||
      (c >= 0xfff9 && c <= 0xfffb))
    return false;
  if ((c >= 0xd800 && c <= 0xf8ff) || (c >= 0xfdd0 && c <= 0xfdef) || (c & 0xfffe) == 0xfffe) return false;
  if (c >= 0xe0000) return false;  // tags, variation selectors supplement, private use planes
  return true;
}

bool is_digit(char32_t c) { return (c >= '0' && c <= '9') || (c >= 0xff10 && c <= 0xff19); }

namespace {

// Simple case pairs: [lo, hi] ranges where upper + delta = lower, or
// alternating pairs (even/odd) when `alternate`.
struct CaseRange {
  char32_t first, last;
  int delta;       // lower - upper for plain ranges
  bool alternate;  // pairs (upper, upper + 1), upper at even offset from first
};

constexpr CaseRange kRanges[] = {
    {0x41, 0x5a, 32, false},   {0xc0, 0xd6, 32, false},   {0xd8, 0xde, 32, false},     {0x100, 0x12f, 1, true},
    {0x132, 0x137, 1, true},   {0x139, 0x148, 1, true},   {0x14a, 0x177, 1, true},     {0x179, 0x17e, 1, true},
    {0x182, 0x185, 1, true},   {0x1a0, 0x1a5, 1, true},   {0x1cd, 0x1dc, 1, true},     {0x1de, 0x1ef, 1, true},
    {0x1f8, 0x21f, 1, true},   {0x222, 0x233, 1, true},   {0x246, 0x24f, 1, true},     {0x370, 0x373, 1, true},
    {0x388, 0x38a, 37, false}, {0x38e, 0x38f, 63, false}, {0x391, 0x3a1, 32, false},   {0x3a3, 0x3ab, 32, false},
    {0x3d8, 0x3ef, 1, true},   {0x400, 0x40f, 80, false}, {0x410, 0x42f, 32, false},   {0x460, 0x481, 1, true},
    {0x48a, 0x4bf, 1, true},   {0x4c1, 0x4ce, 1, true},   {0x4d0, 0x52f, 1, true},     {0x531, 0x556, 48, false},
    {0x1e00, 0x1e95, 1, true}, {0x1ea0, 0x1eff, 1, true}, {0xff21, 0xff3a, 32, false},
};

char32_t lower_of(char32_t c) {
  if (c == 0x386) return 0x3ac;
  if (c == 0x38c) return 0x3cc;
  if (c == 0x178) return 0xff;
  if (c == 0x130) return 'i';
  for (const CaseRange& r : kRanges) {
    if (c < r.first || c > r.last) continue;
    if (!r.alternate) return c + char32_t(r.delta);
    return ((c - r.first) % 2 == 0) ? c + 1 : c;
  }
  return c;
}

char32_t upper_of(char32_t c) {
  if (c == 0x3ac) return 0x386;
  if (c == 0x3cc) return 0x38c;
  if (c == 0xff) return 0x178;
  if (c == 0xb5) return 0x39c;
  if (c == 0x131) return 'I';
  if (c == 0x3c2) return 0x3a3;  // final sigma
  for (const CaseRange& r : kRanges) {
    if (!r.alternate) {
      const char32_t lo = r.first + char32_t(r.delta), hi = r.last + char32_t(r.delta);
      if (c >= lo && c <= hi) return c - char32_t(r.delta);
    } else if (c > r.first && c <= r.last && (c - r.first) % 2 == 1) {
      return c - 1;
    }
  }
  return c;
}

}  // namespace

char32_t lower(char32_t c) { return c < 0x80 ? (c >= 'A' && c <= 'Z' ? c + 32 : c) : lower_of(c); }
char32_t upper(char32_t c) { return c < 0x80 ? (c >= 'a' && c <= 'z' ? c - 32 : c) : upper_of(c); }

void append_upper(std::string& out, char32_t c) {
  if (c == 0xdf) {
    out += "SS";
    return;
  }
  append(out, upper(c));
}

bool is_upper(char32_t c) { return lower(c) != c || c == 0x130; }
bool is_lower(char32_t c) { return upper(c) != c || c == 0xdf || c == 0x138 || c == 0x149; }
bool is_cased(char32_t c) { return is_upper(c) || is_lower(c); }

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
  if (is_cased(c) || c == 0xaa || c == 0xba) return true;
  if (c < 0x100) return false;  // Latin-1 punctuation and symbols
  if ((c >= 0x2000 && c <= 0x2bff) || (c >= 0x3000 && c <= 0x303f) || (c >= 0xfe30 && c <= 0xfe4f) ||
      (c >= 0xff00 && c <= 0xff20) || (c >= 0xff3b && c <= 0xff40) || (c >= 0xff5b && c <= 0xff65) ||
      (c >= 0x1f000 && c <= 0x1faff) || (c >= 0xe000 && c <= 0xf8ff) || !is_printable(c))
    return false;  // punctuation, symbols, emoji, private use
  return !is_digit(c);
}

bool is_word(char32_t c) { return c == '_' || is_digit(c) || is_alpha(c); }

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append(out, lower(next(s, i)));
  return out;
}

std::string to_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_upper(out, next(s, i));
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = next(s, i);
    if (first)
      append_upper(out, c);
    else
      append(out, lower(c));
    first = false;
  }
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = next(s, i);
    if (prev_cased)
      append(out, lower(c));
    else
      append_upper(out, c);
    prev_cased = is_cased(c);
  }
  return out;
}

}  // namespace kvs::jinja::uni
