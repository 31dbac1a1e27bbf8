// tokenizer.ggml.* metadata -> Vocab. Everything is validated here so the
// tokenizers can index the arrays without further checks.
#include <cctype>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "model/gguf.h"
#include "model/vocab_loaders.h"
#include "tokenizer/pre_type.h"
#include "tokenizer/special.h"

namespace kvs {

namespace {

[[noreturn]] void fail(const GgufFile& f, const std::string& key, const std::string& what) {
  throw ModelError(f.path() + ": key '" + key + "' " + what);
}

const GgufArray* opt_array(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) return nullptr;
  if (!v->is_array()) fail(f, key, "is not an array");
  return &v->as_arr();
}

// The typed views are filled for big arrays; the generic items are the
// fallback, so either representation is accepted.
std::vector<std::string> string_array(const GgufFile& f, const std::string& key, const GgufArray& a) {
  if (a.elem_type != GgufType::STRING) fail(f, key, "is not an array of strings");
  if (!a.strings.empty() || a.items.empty()) return a.strings;
  std::vector<std::string> out;
  out.reserve(a.items.size());
  for (const GgufValue& it : a.items) out.push_back(it.as_str());
  return out;
}

std::vector<float> float_array(const GgufFile& f, const std::string& key, const GgufArray& a) {
  if (a.elem_type != GgufType::FLOAT32 && a.elem_type != GgufType::FLOAT64) fail(f, key, "is not an array of floats");
  if (!a.f32.empty() || a.items.empty()) return a.f32;
  std::vector<float> out;
  out.reserve(a.items.size());
  for (const GgufValue& it : a.items) out.push_back(static_cast<float>(it.as_f64()));
  return out;
}

std::vector<int64_t> int_array(const GgufFile& f, const std::string& key, const GgufArray& a) {
  if (!gguf_is_integer(a.elem_type)) fail(f, key, "is not an array of integers");
  if (!a.ints.empty() || a.items.empty()) return a.ints;
  std::vector<int64_t> out;
  out.reserve(a.items.size());
  for (const GgufValue& it : a.items) out.push_back(it.as_i64());
  return out;
}

// Integer scalar of any width/signedness; values meaning "none" (negative, or
// the all-ones pattern llama.cpp's converters write for "unset") give -1.
std::optional<int64_t> opt_int(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&v->v)) {
    if (*u == 0xFFFFFFFFull || *u == std::numeric_limits<uint64_t>::max()) return -1;
    if (*u > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) fail(f, key, "is out of range");
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v->v)) return *i < 0 ? -1 : *i;
  fail(f, key, "is not an integer");
}

std::optional<bool> opt_flag(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) return std::nullopt;
  if (const auto* b = std::get_if<bool>(&v->v)) return *b;
  // Some converters wrote flags as integers.
  if (const auto* u = std::get_if<uint64_t>(&v->v)) return *u != 0;
  if (const auto* i = std::get_if<int64_t>(&v->v)) return *i != 0;
  fail(f, key, "is not a boolean");
}

std::optional<std::string> opt_string(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) fail(f, key, "is not a string");
  return v->as_str();
}

int token_id(const GgufFile& f, const std::string& key, size_t n_vocab) {
  const auto id = opt_int(f, key);
  if (!id || *id < 0) return -1;
  if (static_cast<uint64_t>(*id) >= n_vocab)
    fail(f, key, "= " + std::to_string(*id) + " is not a token id (vocabulary has " + std::to_string(n_vocab) + ")");
  return static_cast<int>(*id);
}

// Only byte-level BPE has a pre-tokenizer; llama.cpp reads the key for
// nothing else (SentencePiece files say "default" or nothing): nullptr there.
const PreType* checked_pre_type(const GgufFile& f, const Vocab& v) {
  if (v.kind != VocabKind::Gpt2) return nullptr;
  const PreType* t = find_pre_type(v.pre);
  if (!t)
    fail(f, "tokenizer.ggml.pre", "= '" + v.pre + "' names a pre-tokenizer kvserve does not know (known: " +
                                      known_pre_types() + ")");
  return t;
}

// llama.cpp marks the special tokens of a model whose general.name contains
// "phi-3" or "phi3" (any case) to drop the white space after them, except
// <unk>, <s> and <|endoftext|>: the chat template's "<|user|>\n" tokenizes
// without the newline.
void mark_phi3_strips(const GgufFile& f, Vocab& v) {
  std::string name = opt_string(f, "general.name").value_or("");
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
  v.strip.assign(v.size(), 0);
  for (size_t id = 0; id < v.size(); ++id) {
    const TokenAttr a = token_attr(v, static_cast<int>(id));
    const std::string& t = v.tokens[id];
    const bool special = a == TokenAttr::Control || a == TokenAttr::UserDefined || a == TokenAttr::Unknown;
    if (special && t != "<unk>" && t != "<s>" && t != "<|endoftext|>") v.strip[id] = kStripRight;
  }
}

}  // namespace

Vocab vocab_from_gguf(const GgufFile& f) {
  Vocab v;
  const std::string model_key = "tokenizer.ggml.model";
  const auto model = opt_string(f, model_key);
  if (!model) throw ModelError(f.path() + ": key '" + model_key + "' missing: the file has no vocabulary");
  if (*model == "llama") {
    v.kind = VocabKind::Spm;
  } else if (*model == "gpt2") {
    v.kind = VocabKind::Gpt2;
  } else {
    fail(f, model_key, "= '" + *model + "' names an unsupported tokenizer (supported: llama, gpt2)");
  }
  v.pre = opt_string(f, "tokenizer.ggml.pre").value_or("");
  const PreType* pre_type = checked_pre_type(f, v);

  const GgufArray* tokens = opt_array(f, "tokenizer.ggml.tokens");
  if (tokens) v.tokens = string_array(f, "tokenizer.ggml.tokens", *tokens);
  if (v.tokens.empty()) fail(f, "tokenizer.ggml.tokens", "missing or empty");
  const size_t n = v.tokens.size();
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) fail(f, "tokenizer.ggml.tokens", "is too large");

  if (const GgufArray* scores = opt_array(f, "tokenizer.ggml.scores")) {
    v.scores = float_array(f, "tokenizer.ggml.scores", *scores);
    if (v.scores.size() != n)
      fail(f, "tokenizer.ggml.scores", "has " + std::to_string(v.scores.size()) + " entries for " +
                                           std::to_string(n) + " tokens");
  } else if (v.kind == VocabKind::Spm) {
    // SentencePiece merges by score; without scores every merge ties, which
    // still tokenizes (leftmost first) but not as the model was trained.
    v.scores.assign(n, 0.f);
  }

  if (const GgufArray* types = opt_array(f, "tokenizer.ggml.token_type")) {
    const std::vector<int64_t> ts = int_array(f, "tokenizer.ggml.token_type", *types);
    if (ts.size() != n)
      fail(f, "tokenizer.ggml.token_type", "has " + std::to_string(ts.size()) + " entries for " +
                                               std::to_string(n) + " tokens");
    v.types.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = ts[i];
      if (t < 0 || t > static_cast<int64_t>(TokenAttr::Byte)) {
        std::string what = "entry ";  // built stepwise: GCC 12 warns falsely (-Wrestrict) on "[" + ...
        what += std::to_string(i);
        what += " = ";
        what += std::to_string(t);
        what += " is not a token type";
        fail(f, "tokenizer.ggml.token_type", what);
      }
      v.types[i] = static_cast<int32_t>(t);
    }
  }

  if (const GgufArray* merges = opt_array(f, "tokenizer.ggml.merges"))
    v.merges = string_array(f, "tokenizer.ggml.merges", *merges);
  if (v.kind == VocabKind::Gpt2 && v.merges.empty()) fail(f, "tokenizer.ggml.merges", "missing: a gpt2 vocabulary needs merges");

  v.bos = token_id(f, "tokenizer.ggml.bos_token_id", n);
  v.eos = token_id(f, "tokenizer.ggml.eos_token_id", n);
  v.unk = token_id(f, "tokenizer.ggml.unknown_token_id", n);
  v.pad = token_id(f, "tokenizer.ggml.padding_token_id", n);
  if (v.kind == VocabKind::Spm) {
    // llama.cpp's defaults for SentencePiece vocabs when keys are absent.
    if (v.bos < 0 && !f.find("tokenizer.ggml.bos_token_id") && n > 1) v.bos = 1;
    if (v.eos < 0 && !f.find("tokenizer.ggml.eos_token_id") && n > 2) v.eos = 2;
    if (v.unk < 0 && !f.find("tokenizer.ggml.unknown_token_id")) v.unk = 0;
  }

  v.add_bos = opt_flag(f, "tokenizer.ggml.add_bos_token").value_or(pre_type ? pre_type->add_bos : v.kind == VocabKind::Spm);
  v.add_eos = opt_flag(f, "tokenizer.ggml.add_eos_token").value_or(false);
  v.add_space_prefix = opt_flag(f, "tokenizer.ggml.add_space_prefix").value_or(v.kind == VocabKind::Spm);
  if (v.add_bos && v.bos < 0) fail(f, "tokenizer.ggml.add_bos_token", "is true but there is no BOS token id");
  if (v.add_eos && v.eos < 0) fail(f, "tokenizer.ggml.add_eos_token", "is true but there is no EOS token id");
  mark_phi3_strips(f, v);
  v.chat_template = opt_string(f, "tokenizer.chat_template").value_or("");
  static const std::string kVariant = "tokenizer.chat_template.";
  for (const auto& [key, value] : f.metadata())
    if (key.size() > kVariant.size() && key.compare(0, kVariant.size(), kVariant) == 0)
      v.chat_template_variants.emplace_back(key.substr(kVariant.size()), opt_string(f, key).value_or(""));
  return v;
}

}  // namespace kvs
