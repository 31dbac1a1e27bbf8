// Vocabulary readers for the model file formats: they fill the tokenizer's
// plain Vocab from a GGUF file's tokenizer.ggml.* keys or from a llama2.c
// tokenizer file. They live with the model loaders (file formats, ModelError)
// so that the tokenizer module knows nothing about files.
#pragma once
#include <string>

#include "tokenizer/vocab.h"

namespace kvs {

class GgufFile;

// Reads a llama2.c tokenizer file (tok512.bin / tokenizer.bin):
// int32 max_token_length, then per token: float32 score, int32 len, bytes.
// Pieces use a plain ' ' (converted here to U+2581 so the SPM code sees the
// same form as GGUF); BOS 1, EOS 2, byte tokens <0xNN>. Throws ModelError.
Vocab read_llama2c_vocab(const std::string& path, int n_vocab);

// Reads tokenizer.ggml.* (model, pre, tokens, scores, token_type, merges,
// bos/eos/unk/pad ids, add_bos_token/add_eos_token, add_space_prefix),
// tokenizer.chat_template and its named variants tokenizer.chat_template.NAME. Defaults as llama.cpp: add_bos on for "llama",
// for "gpt2" the pre-type's (on for llama-bpe and tekken); Phi-3's special
// tokens (by general.name) strip the white space after them. Throws
// ModelError naming the key when something is wrong, including a "gpt2"
// tokenizer.ggml.pre that pre_type.h does not know.
Vocab vocab_from_gguf(const GgufFile& f);

}  // namespace kvs
