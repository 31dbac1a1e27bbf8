// Vocabulary data as stored in a model file, independent of the algorithm
// that uses it. Filled by the GGUF loader (tokenizer.ggml.*) or the llama2.c
// tokenizer reader.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

enum class VocabKind { None, Spm, Gpt2 };  // tokenizer.ggml.model: "llama" / "gpt2"

// llama.cpp token types (tokenizer.ggml.token_type)
enum class TokenAttr : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct Vocab {
  VocabKind kind = VocabKind::None;
  std::string pre;                      // tokenizer.ggml.pre (gpt2 pre-tokenizer name)
  std::vector<std::string> tokens;      // id -> piece (SPM: with U+2581 for space; GPT-2: byte-mapped unicode)
  std::vector<float> scores;            // SPM merge scores (may be empty for gpt2)
  std::vector<int32_t> types;           // TokenAttr per id (may be empty => Normal)
  std::vector<std::string> merges;      // GPT-2: "a b" in rank order
  int bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = true;         // SPM leading-space rule
  std::string chat_template;            // tokenizer.chat_template, if any
  bool llama2c = false;                 // llama2.c convention: generated BOS ends the text
  size_t size() const { return tokens.size(); }
};

// Reads a llama2.c tokenizer file (tok512.bin / tokenizer.bin):
// int32 max_token_length, then per token: float32 score, int32 len, bytes.
// Pieces use a plain ' ' (converted here to U+2581 so the SPM code sees the
// same form as GGUF); BOS 1, EOS 2, byte tokens <0xNN>. Throws ModelError.
Vocab read_llama2c_vocab(const std::string& path, int n_vocab);

}  // namespace kvs

namespace kvs {
class GgufFile;
// Reads tokenizer.ggml.* (model, pre, tokens, scores, token_type, merges,
// bos/eos/unk/pad ids, add_bos_token/add_eos_token, add_space_prefix) and
// tokenizer.chat_template. Defaults as llama.cpp: add_bos on for "llama",
// off for "gpt2". Throws ModelError naming the key when something is wrong.
Vocab vocab_from_gguf(const GgufFile& f);
}  // namespace kvs
