#include "tokenizer/tokenizer.h"

#include <stdexcept>
#include <string_view>

#include "tokenizer/gpt2.h"
#include "tokenizer/special.h"
#include "tokenizer/spm.h"

namespace kvs {

std::unique_ptr<Tokenizer> Tokenizer::create(const Vocab& vocab) {
  switch (vocab.kind) {
    case VocabKind::Spm:
      return std::make_unique<SpmTokenizer>(vocab);
    case VocabKind::Gpt2:
      return std::make_unique<Gpt2Tokenizer>(vocab);
    case VocabKind::None:
      break;
  }
  throw std::invalid_argument("Tokenizer::create: the model has no vocabulary (tokenizer.ggml.model missing)");
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string out;
  int prev = -1;
  for (int id : ids) {
    out += token_bytes(id, prev);
    prev = id;
  }
  return out;
}

bool Tokenizer::is_eog(int id) const {
  if (!token_in_vocab(id, n_vocab())) return false;
  if (id == vocab_.eos) return true;
  // llama2.c models end a story by generating BOS.
  if (vocab_.llama2c && id == vocab_.bos) return true;
  if (token_attr(vocab_, id) != TokenAttr::Control) return false;
  // Chat models end a turn with a control token other than EOS; these are the
  // spellings used by the common families (GPT-2/Qwen, ChatML, Llama 2/3,
  // Phi-3, Gemma; gpt-oss ends a tool-call turn with <|call|>).
  static constexpr std::string_view kEnd[] = {
      "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
      "</s>",          "<|end|>",    "<end_of_turn>", "<|return|>", "<|call|>",
  };
  const std::string& t = vocab_.tokens[static_cast<size_t>(id)];
  for (std::string_view e : kEnd)
    if (t == e) return true;
  return false;
}

}  // namespace kvs
