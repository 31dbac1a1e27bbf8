#include "tokenizer/pre_type.h"

#include <array>

namespace kvs {

namespace {

// Contractions, in either case ((?i:'s|'t|...) in the Hugging Face files).
#define KVS_CONTRACTION "'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])"
// tekken and o200k tell upper from lower case with \p{Lu}... classes;
// llama.cpp tests the case of ASCII letters only (any other letter counts as
// both) and leaves marks (\p{M}) out of words. Spelled as it behaves.
#define KVS_UPPER "(?:(?=\\p{L})[^a-z])"
#define KVS_LOWER "(?:(?=\\p{L})[^A-Z])"

constexpr std::string_view kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kLlama3 = KVS_CONTRACTION
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2 = KVS_CONTRACTION
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kTekken =
    "[^\\r\\n\\p{L}\\p{N}]?" KVS_UPPER "*" KVS_LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" KVS_UPPER "+" KVS_LOWER
    "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kO200k =
    "[^\\r\\n\\p{L}\\p{N}]?" KVS_UPPER "*" KVS_LOWER "+(?:" KVS_CONTRACTION ")?|[^\\r\\n\\p{L}\\p{N}]?" KVS_UPPER
    "+" KVS_LOWER "*(?:" KVS_CONTRACTION ")?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

#undef KVS_CONTRACTION
#undef KVS_UPPER
#undef KVS_LOWER

// llama.cpp's rule for vocabularies that name no pre-tokenizer: punctuation
// runs first, then GPT-2's rule, then digit runs cut into threes.
constexpr std::array<std::string_view, 4> kDefaultSeq = {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+",
                                                         "[0-9][0-9][0-9]"};
constexpr std::array<std::string_view, 1> kGpt2Seq = {kGpt2};
constexpr std::array<std::string_view, 1> kLlama3Seq = {kLlama3};
constexpr std::array<std::string_view, 1> kQwen2Seq = {kQwen2};
constexpr std::array<std::string_view, 1> kTekkenSeq = {kTekken};
constexpr std::array<std::string_view, 1> kO200kSeq = {kO200k};

// Names in llama.cpp's groups; a group's names behave identically.
// (clean_spaces, which llama.cpp also sets per name, changes only its
// whole-string llama_detokenize; kvserve's decode is piece by piece, as
// llama-server's streaming and /detokenize are.)
const PreType kTypes[] = {
    {"default", kDefaultSeq},
    {"gpt-2", kGpt2Seq},
    {"phi-2", kGpt2Seq},
    {"llama-bpe", kLlama3Seq, /*ignore_merges=*/true, /*add_bos=*/true},  // Llama 3.x
    {"llama3", kLlama3Seq, true, true},
    {"llama-v3", kLlama3Seq, true, true},
    {"falcon3", kLlama3Seq, true, true},
    {"dbrx", kLlama3Seq},  // the Llama 3 regex without its flags (Phi-4)
    {"smaug-bpe", kLlama3Seq},
    {"qwen2", kQwen2Seq},  // Qwen 2, 2.5, 3
    {"deepseek-r1-qwen", kQwen2Seq},
    {"megrez", kQwen2Seq},
    {"tekken", kTekkenSeq, true, true},  // Mistral Nemo, Ministral, Pixtral
    {"gpt-4o", kO200kSeq},               // o200k: gpt-oss
    {"llama4", kO200kSeq},
};

}  // namespace

const PreType* find_pre_type(std::string_view name) {
  if (name.empty()) name = "default";
  for (const PreType& t : kTypes)
    if (t.name == name) return &t;
  return nullptr;
}

std::string known_pre_types() {
  std::string s;
  for (const PreType& t : kTypes) {
    if (!s.empty()) s += ", ";
    s += t.name;
  }
  return s;
}

}  // namespace kvs
