// Streaming detokenizer: a token may end in the middle of a UTF-8 character
// (byte-fallback tokens, byte-level BPE), so bytes are held back until the
// character is complete. Text handed out is always valid UTF-8.
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvs {

std::string token_text(const Tokenizer& tok, int id, bool specials, int prev) {
  const Vocab& v = tok.vocab();
  const bool control = size_t(id) < v.types.size() && v.types[size_t(id)] == int32_t(TokenAttr::Control);
  return specials && control && id != v.bos ? v.tokens[size_t(id)] : tok.token_bytes(id, prev);
}

std::string Detokenizer::push(int id) {
  pending_ += token_text(tok_, id, specials_, prev_);
  prev_ = id;
  const size_t done = utf8::complete_prefix(pending_);
  if (done == 0) return {};
  // Bytes that can never become a character are replaced now rather than
  // held, so one bad byte does not stall the stream.
  std::string out = utf8::sanitize(std::string_view(pending_).substr(0, done));
  pending_.erase(0, done);
  return out;
}

std::string Detokenizer::flush() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace kvs
