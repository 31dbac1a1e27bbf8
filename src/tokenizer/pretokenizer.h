// Regex pre-tokenizer of byte-level BPE vocabularies: splits text into the
// "words" that BPE merges never cross, as llama.cpp does for the vocabulary's
// pre-tokenizer type (pre_type.h). Every regex runs with PCRE2 on a copy of
// the text in which each non-ASCII character stands as one byte for its
// class (unicode_class.h), so \p{L} and friends mean kvserve's Unicode 15.1
// table (the one llama.cpp's classes follow) whatever PCRE2's own Unicode
// version is. The compiled patterns are shared read-only; every call uses its
// own match data, so one PreTokenizer serves many threads.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pre_type.h"

namespace kvs {

// The text as llama.cpp's BPE sees it: its UTF-8 decoder accepts overlong
// and surrogate forms (re-encoded in the shortest form) and turns every other
// invalid byte into U+FFFD; so does this. (A 4-byte form above U+10FFFF,
// on which llama.cpp aborts the call, becomes U+FFFD as well.) Valid UTF-8
// comes back unchanged.
std::string lenient_utf8(std::string_view text);

class PreTokenizer {
 public:
  // Throws std::runtime_error if PCRE2 rejects a regex of the type.
  explicit PreTokenizer(const PreType& type);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Calls `emit` for each pre-token in order; together they cover
  // lenient_utf8(text) exactly (views into `text` when that is valid UTF-8,
  // else into a copy that lives for the call). Text no regex matches between
  // two matches is a pre-token of its own, as in llama.cpp.
  void split(std::string_view text, const std::function<void(std::string_view)>& emit) const;
  const PreType& type() const { return type_; }

  // The PCRE2 pattern a regex becomes: each \p{X} (and the class it is in)
  // replaced by its class byte plus the ASCII characters of that class.
  static std::string compile_form(std::string_view regex);

 private:
  struct Scratch;
  void run(size_t regex, const Scratch& s, size_t from, size_t to, std::vector<uint32_t>& cuts) const;

  const PreType& type_;
  std::vector<void*> codes_;  // pcre2_code_8*, one per regex (kept out of the header)
};

}  // namespace kvs
