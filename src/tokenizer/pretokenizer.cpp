#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>

namespace kvs {

namespace {

// The split patterns of the respective Hugging Face tokenizers. Llama 3 and
// Qwen2 match contractions case-insensitively; the classes are spelled out
// ('[sS]') so the pattern reads the same as llama.cpp's copy of it.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

void warn_once(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(name).second)
    std::fprintf(stderr, "kvserve: warning: unknown pre-tokenizer '%s' (tokenizer.ggml.pre); using the GPT-2 rule\n",
                 name.c_str());
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

std::string pretokenizer_pattern(const std::string& name, bool* known) {
  if (known) *known = true;
  if (name.empty() || name == "default" || name == "gpt2" || name == "gpt-2") return kGpt2;
  if (name == "llama3" || name == "llama-bpe" || name == "llama-v3") return kLlama3;
  if (name == "qwen2") return kQwen2;
  if (known) *known = false;
  return kGpt2;
}

PreTokenizer::PreTokenizer(const std::string& name) {
  bool known = true;
  pattern_ = pretokenizer_pattern(name, &known);
  if (!known) warn_once(name);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // MATCH_INVALID_UTF: arbitrary bytes are allowed in the subject; invalid
  // sequences simply never match, instead of making every match fail.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.c_str()), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
  if (!code)
    throw std::runtime_error("pre-tokenizer '" + name + "': PCRE2 rejects the pattern at offset " +
                             std::to_string(err_off) + ": " + pcre2_message(err));
  // JIT is an optimisation only: if it is unavailable the interpreter runs.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

PreTokenizer::~PreTokenizer() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  const auto* code = static_cast<const pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, MatchDataFree> md(pcre2_match_data_create_from_pattern(code, nullptr));
  if (!md) throw std::bad_alloc();
  // Created only if the default JIT stack (32 KiB) or heap limit proves too
  // small for some input (very long runs of one class).
  std::unique_ptr<pcre2_match_context, MatchContextFree> mctx;
  std::unique_ptr<pcre2_jit_stack, JitStackFree> jit_stack;

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0, last = 0;  // search start; end of what has been emitted
  while (pos < n) {
    int rc = pcre2_match(code, subject, n, pos, 0, md.get(), mctx.get());
    if ((rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_HEAPLIMIT) && !mctx) {
      mctx.reset(pcre2_match_context_create(nullptr));
      jit_stack.reset(pcre2_jit_stack_create(64 * 1024, 512 * 1024 * 1024, nullptr));
      if (!mctx || !jit_stack) throw std::bad_alloc();
      pcre2_jit_stack_assign(mctx.get(), nullptr, jit_stack.get());
      pcre2_set_heap_limit(mctx.get(), 4u * 1024 * 1024);  // KiB: 4 GiB for the interpreter
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error("pre-tokenizer: PCRE2 match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t s = ov[0], e = ov[1];
    if (e <= s) {  // an empty match cannot happen with our patterns; never loop
      pos = s + 1;
      continue;
    }
    if (s > last) emit(text.substr(last, s - last));  // skipped invalid bytes
    emit(text.substr(s, e - s));
    last = pos = e;
  }
  if (last < n) emit(text.substr(last));
}

}  // namespace kvs
