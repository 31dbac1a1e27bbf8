// A built-in SentencePiece-style vocabulary for generated models: <unk>,
// <s>, </s>, the 256 byte tokens <0xNN>, single characters, then pieces of
// common English words (every prefix of each, so the SPM BPE merge chain can
// reach the whole word), then letter pairs and triples to fill any size.
#pragma once
#include "tokenizer/vocab.h"

namespace kvs {

// n_vocab >= 259 (3 specials + 256 bytes); throws std::invalid_argument otherwise.
Vocab builtin_byte_vocab(int n_vocab);

}  // namespace kvs
