// The pre-tokenizer types a byte-level BPE vocabulary names with
// tokenizer.ggml.pre, each defined as llama.cpp defines it: the regexes its
// text is split by (in sequence: each one splits the pieces the previous
// ones left), and the BPE flags that go with the name. Names llama.cpp does
// not know are refused when the model loads; a missing name means "default",
// as in llama.cpp.
#pragma once
#include <span>
#include <string>
#include <string_view>

namespace kvs {

struct PreType {
  std::string_view name;
  // The split regexes, written with \p{L}, \p{N}, \p{P}, \p{S}, \p{M} and \s
  // standing for kvserve's Unicode 15.1 classes (unicode_class.h).
  std::span<const std::string_view> regexes;
  // A pre-token that is itself a piece of the vocabulary is emitted whole,
  // without running the merges (Hugging Face's ignore_merges).
  bool ignore_merges = false;
  // tokenizer.ggml.add_bos_token's value when the key is absent.
  bool add_bos = false;
};

// The type that `name` stands for ("" = "default"), or nullptr when unknown.
const PreType* find_pre_type(std::string_view name);

// Every known name, comma-separated, for error messages and --help.
std::string known_pre_types();

}  // namespace kvs
