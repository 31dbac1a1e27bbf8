#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <memory>
#include <stdexcept>

#include "tokenizer/unicode_class.h"
#include "tokenizer/utf8.h"

namespace kvs {

namespace {

// The byte a non-ASCII character of each class becomes in the collapsed
// text. White space becomes VT, which PCRE2's \s matches and no literal of
// any pattern does; the others are bytes no pattern names except through
// \p{...}, and which \s, \w and \d never match.
constexpr uint8_t kClassByte[] = {
    0xF0,  // Other
    0xF1,  // Letter
    0xF2,  // Number
    0xF3,  // Punct
    0xF4,  // Symbol
    0xF5,  // Mark
    0x0B,  // Space
};

uint8_t collapsed_byte(uint32_t cp) {
  return cp < 0x80 ? static_cast<uint8_t>(cp) : kClassByte[static_cast<size_t>(char_class(cp))];
}

// llama.cpp's UTF-8 decoder: the lead byte's high bits say how many
// continuation bytes follow; only their presence and 10xxxxxx form are
// checked. Returns the bytes consumed; `cp` is U+FFFD for an invalid byte.
size_t lenient_decode(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t need = 0;  // continuation bytes
  if (b < 0x80) {
    cp = b;
    return 1;
  }
  if (b >= 0xC0 && b < 0xE0) need = 1, cp = b & 0x1F;
  else if (b >= 0xE0 && b < 0xF0) need = 2, cp = b & 0x0F;
  else if (b >= 0xF0 && b < 0xF8) need = 3, cp = b & 0x07;
  bool ok = need > 0 && i + need < s.size();
  for (size_t k = 1; ok && k <= need; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    ok = (c & 0xC0) == 0x80;
    cp = (cp << 6) | (c & 0x3F);
  }
  if (!ok || cp > 0x10FFFF) {
    cp = 0xFFFD;
    return 1;
  }
  return need + 1;
}

bool strictly_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const utf8::Decoded d = utf8::decode(s.substr(i));
    if (d.status != utf8::Status::Valid) return false;
    i += d.len;
  }
  return true;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

std::string hex_byte(unsigned b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x{%02x}", b);
  return buf;
}

// The members of \p{name}: its class byte and its ASCII characters.
std::string class_members(std::string_view name) {
  CharClass c;
  if (name == "L") c = CharClass::Letter;
  else if (name == "N") c = CharClass::Number;
  else if (name == "P") c = CharClass::Punct;
  else if (name == "S") c = CharClass::Symbol;
  else if (name == "M") c = CharClass::Mark;
  else throw std::invalid_argument("pre-tokenizer regex: unsupported class \\p{" + std::string(name) + "}");
  std::string m = hex_byte(kClassByte[static_cast<size_t>(c)]);
  for (uint32_t cp = 0; cp < 0x80; ++cp)
    if (char_class(cp) == c) m += hex_byte(cp);
  return m;
}

struct MatchDataFree {
  void operator()(pcre2_match_data* p) const { pcre2_match_data_free(p); }
};
struct MatchContextFree {
  void operator()(pcre2_match_context* p) const { pcre2_match_context_free(p); }
};
struct JitStackFree {
  void operator()(pcre2_jit_stack* p) const { pcre2_jit_stack_free(p); }
};

}  // namespace

std::string lenient_utf8(std::string_view text) {
  if (strictly_valid(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    i += lenient_decode(text, i, cp);
    utf8::append(out, cp);
  }
  return out;
}

std::string PreTokenizer::compile_form(std::string_view re) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      if (re[i + 1] == 'p' && i + 2 < re.size() && re[i + 2] == '{') {
        const size_t close = re.find('}', i + 3);
        if (close == std::string_view::npos) throw std::invalid_argument("pre-tokenizer regex: unclosed \\p{");
        const std::string members = class_members(re.substr(i + 3, close - i - 3));
        out += in_class ? members : "[" + members + "]";
        i = close;
      } else {
        out.append(re.data() + i, 2);  // an escape stays as written
        ++i;
      }
      continue;
    }
    if (c == '[' && !in_class) in_class = true;
    else if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

PreTokenizer::PreTokenizer(const PreType& type) : type_(type) {
  for (std::string_view re : type.regexes) {
    const std::string pattern = compile_form(re);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // Byte mode, no Unicode: the subject is the collapsed text.
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), 0, &err, &err_off, nullptr);
    if (!code) {
      for (void* p : codes_) pcre2_code_free(static_cast<pcre2_code*>(p));
      throw std::runtime_error("pre-tokenizer '" + std::string(type.name) + "': PCRE2 rejects " + pattern +
                               " at offset " + std::to_string(err_off) + ": " + pcre2_message(err));
    }
    // JIT is an optimisation only: if it is unavailable the interpreter runs.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    codes_.push_back(code);
  }
}

PreTokenizer::~PreTokenizer() {
  for (void* p : codes_) pcre2_code_free(static_cast<pcre2_code*>(p));
}

struct PreTokenizer::Scratch {
  std::string collapsed;       // one byte per character
  std::vector<uint32_t> offs;  // byte offset of each character, then the end
  std::vector<std::unique_ptr<pcre2_match_data, MatchDataFree>> md;  // per regex
  // Created only if the default JIT stack (32 KiB) or heap limit proves too
  // small for some input (very long runs of one class).
  mutable std::unique_ptr<pcre2_match_context, MatchContextFree> mctx;
  mutable std::unique_ptr<pcre2_jit_stack, JitStackFree> jit_stack;
};

// Appends to `cuts` the boundaries regex `r` puts into the characters
// [from, to), ending with `to`: each match, and each gap between matches,
// is a piece. The subject is only that range, so a lookahead ends there.
void PreTokenizer::run(size_t r, const Scratch& s, size_t from, size_t to, std::vector<uint32_t>& cuts) const {
  const auto* code = static_cast<const pcre2_code*>(codes_[r]);
  pcre2_match_data* md = s.md[r].get();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.collapsed.data() + from);
  const size_t n = to - from;
  size_t pos = 0;
  while (pos < n) {
    const int rc = pcre2_match(code, subject, n, pos, 0, md, s.mctx.get());
    if ((rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_HEAPLIMIT) && !s.mctx) {
      s.mctx.reset(pcre2_match_context_create(nullptr));
      s.jit_stack.reset(pcre2_jit_stack_create(64 * 1024, 512 * 1024 * 1024, nullptr));
      if (!s.mctx || !s.jit_stack) throw std::bad_alloc();
      pcre2_jit_stack_assign(s.mctx.get(), nullptr, s.jit_stack.get());
      pcre2_set_heap_limit(s.mctx.get(), 4u * 1024 * 1024);  // KiB: 4 GiB for the interpreter
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error("pre-tokenizer: PCRE2 match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e <= b) {  // no pattern matches the empty string; never loop
      pos = b + 1;
      continue;
    }
    if (from + b != cuts.back()) cuts.push_back(static_cast<uint32_t>(from + b));  // the gap before it
    cuts.push_back(static_cast<uint32_t>(from + e));
    pos = e;
  }
  if (cuts.back() != to) cuts.push_back(static_cast<uint32_t>(to));
}

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  if (text.empty()) return;
  std::string owned;
  if (!strictly_valid(text)) {
    owned = lenient_utf8(text);
    text = owned;
  }
  Scratch s;
  s.collapsed.reserve(text.size());
  s.offs.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    s.offs.push_back(static_cast<uint32_t>(i));
    i += lenient_decode(text, i, cp);  // valid or a surrogate here: never U+FFFD for a byte
    s.collapsed += static_cast<char>(collapsed_byte(cp));
  }
  s.offs.push_back(static_cast<uint32_t>(text.size()));
  for (void* code : codes_) {
    s.md.emplace_back(pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(code), nullptr));
    if (!s.md.back()) throw std::bad_alloc();
  }

  // Boundaries between pieces, in characters; each regex refines them.
  std::vector<uint32_t> cuts = {0, static_cast<uint32_t>(s.collapsed.size())}, next;
  for (size_t r = 0; r < codes_.size(); ++r) {
    next.assign(1, 0);
    for (size_t k = 0; k + 1 < cuts.size(); ++k) run(r, s, cuts[k], cuts[k + 1], next);
    cuts.swap(next);
  }
  for (size_t k = 0; k + 1 < cuts.size(); ++k)
    emit(text.substr(s.offs[cuts[k]], s.offs[cuts[k + 1]] - s.offs[cuts[k]]));
}

}  // namespace kvs
