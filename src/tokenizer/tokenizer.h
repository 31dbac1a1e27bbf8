// Tokenizers: SentencePiece-style BPE (scores, byte fallback) and GPT-2
// byte-level BPE (merge ranks, PCRE2 pre-tokenizer). Stateless after
// construction and safe to share across threads.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include "tokenizer/vocab.h"

namespace kvs {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Builds the tokenizer that `vocab.kind` names. Throws on an unusable vocab.
  static std::unique_ptr<Tokenizer> create(const Vocab& vocab);

  // Text -> ids. add_bos: prepend BOS when the vocab says so (vocab.add_bos),
  // and append EOS when vocab.add_eos (llama.cpp's add_special).
  // parse_special: recognise control/user-defined token texts like "<|im_start|>".
  virtual std::vector<int> encode(std::string_view text, bool add_bos, bool parse_special = false) const = 0;
  // Raw bytes of one token as it contributes to the output text (byte tokens
  // become their byte; SPM U+2581 becomes ' '; GPT-2 unicode maps back to bytes;
  // control tokens give ""). `prev` is the previous token id or -1 (SPM drops
  // the leading space after BOS).
  virtual std::string token_bytes(int id, int prev) const = 0;
  std::string decode(const std::vector<int>& ids) const;  // concatenated token_bytes
  const Vocab& vocab() const { return vocab_; }
  int n_vocab() const { return static_cast<int>(vocab_.size()); }
  bool is_eog(int id) const;  // EOS, EOT-like control tokens

 protected:
  explicit Tokenizer(const Vocab& v) : vocab_(v) {}
  Vocab vocab_;
};

// The bytes token `id` adds after token `prev` (-1: none); with `specials`
// a control token other than BOS adds its own text ("<|python_tag|>").
std::string token_text(const Tokenizer& tok, int id, bool specials, int prev = -1);

// Streaming detokenizer: feed tokens, get text that is complete UTF-8. Bytes
// of a split multi-byte character are held until the rest arrives.
class Detokenizer {
 public:
  // `specials`: control tokens add their own text ("<|python_tag|>"), for
  // parsers that read the markers a chat template taught the model (tool
  // calls); otherwise they add nothing.
  explicit Detokenizer(const Tokenizer& tok, bool specials = false) : tok_(tok), specials_(specials) {}
  std::string push(int id);  // returns newly completed text (may be "")
  std::string flush();       // whatever is held, invalid bytes replaced by U+FFFD
 private:
  const Tokenizer& tok_;
  bool specials_ = false;
  std::string pending_;
  int prev_ = -1;
};

}  // namespace kvs
