// The tokenizer pre-types of the architectures kvserve runs, against the
// peer: vocabulary files made here from ../shared's real GPT-2 (byte-level
// BPE) and Llama (SentencePiece) vocabularies, with tokenizer.ggml.pre set to
// each pre-type and the SentencePiece flags of Gemma and Phi-3, must turn
// every input of tests/pretok/cases.json (plus llama.cpp's own vocab test
// strings and a page of ../shared/eval text) into exactly the ids that
// llama.cpp b4748 produced for the same files (ik_llama.cpp's for gpt-4o,
// which b4748 predates; the two peers agree on every other input). Those
// ids are data in tests/pretok/peer_ids.json; tests/pretok/record_peer_ids.py
// wrote it (the commands and peer versions are in the file). Also: an unknown
// pre-type is refused at load, naming the key, the value and the known names.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "gguf_test_util.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/vocab_loaders.h"
#include "test_util.h"
#include "tokenizer/pre_type.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace kvs {
namespace {

using nlohmann::json;

const std::string kDir = std::string(KVS_SOURCE_DIR) + "/tests/pretok/";

// ------------------------------------------------------------- variants

struct Variant {
  const char* name;
  const char* from;  // under ../shared
  std::function<void(const Vocab& src, GgufWriter&)> edit;
};

std::function<void(const Vocab&, GgufWriter&)> pre(const char* p) {
  return [p](const Vocab&, GgufWriter& w) { w.set_str("tokenizer.ggml.pre", p); };
}

// Marks the tokens with these texts as user-defined: they are split out of
// any text, longest first, before the BPE runs.
void user_defined(const Vocab& v, GgufWriter& w, std::initializer_list<const char*> texts) {
  std::vector<int32_t> types = v.types;
  types.resize(v.size(), int32_t(TokenAttr::Normal));
  for (const char* t : texts) {
    const auto it = std::find(v.tokens.begin(), v.tokens.end(), t);
    if (it == v.tokens.end()) throw std::runtime_error(std::string("no token '") + t + "'");
    types[size_t(it - v.tokens.begin())] = int32_t(TokenAttr::UserDefined);
  }
  w.set_i32_array("tokenizer.ggml.token_type", types);
}

const char* kGpt2 = "golden/tokenizer/ggml-vocab-gpt-2.gguf";
const char* kSpm = "golden/tokenizer/ggml-vocab-llama-spm.gguf";

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"default", kGpt2, pre("default")},
      {"gpt-2", kGpt2, pre("gpt-2")},
      {"llama-bpe", kGpt2, pre("llama-bpe")},  // no add_bos key: the pre-type's default (true) holds
      {"dbrx", kGpt2, pre("dbrx")},
      {"qwen2", kGpt2, pre("qwen2")},
      {"tekken", kGpt2, pre("tekken")},
      {"gpt-4o", kGpt2, pre("gpt-4o")},
      // Overlapping user-defined texts: "ello" (longer) is split out before "Hel".
      {"llama-bpe-user", kGpt2,
       [](const Vocab& v, GgufWriter& w) {
         w.set_str("tokenizer.ggml.pre", "llama-bpe");
         user_defined(v, w, {"Hel", "ello"});
       }},
      {"llama-spm", kSpm, nullptr},
      // Gemma 2 / 3: SentencePiece with byte fallback and no space prefix.
      {"gemma-spm", kSpm,
       [](const Vocab&, GgufWriter& w) {
         w.set_bool("tokenizer.ggml.add_space_prefix", false);
         w.set_str("general.name", "gemma-3-test");
       }},
      // Phi-3: the Llama vocabulary plus its chat tokens; by the model's name,
      // special tokens drop the white space after them.
      {"phi3-spm", kSpm,
       [](const Vocab& v, GgufWriter& w) {
         w.set_str("general.name", "Phi-3-mini-4k-instruct");
         Vocab p = v;
         for (const char* t : {"<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"}) {
           p.tokens.push_back(t);
           p.scores.push_back(-1000.f);
           p.types.push_back(int32_t(TokenAttr::Control));
         }
         w.set_str_array("tokenizer.ggml.tokens", p.tokens);
         w.set_f32_array("tokenizer.ggml.scores", p.scores);
         user_defined(p, w, {"ing"});
       }},
  };
  return v;
}

// Writes the variant as a vocabulary-only GGUF (every key, no tensors) into
// `dir`; returns its path.
std::string write_variant(const Variant& v, const std::string& dir) {
  const std::string src = test::shared(v.from), dst = dir + "/" + v.name + ".gguf";
  const Vocab vocab = vocab_from_gguf(*GgufFile::open(src));
  test::rewrite_gguf(src, dst, [&](GgufWriter& w) {
    if (v.edit) v.edit(vocab, w);
  }, nullptr);
  return dst;
}

// KVS_PRETOK_EXPORT=DIR keeps the files in DIR, for record_peer_ids.py.
std::string variant_dir() {
  static const std::string dir = [] {
    const char* e = std::getenv("KVS_PRETOK_EXPORT");
    std::string d = e && *e ? e : test::temp_dir() + "/pretok";
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& t = cache[name];
  if (!t) {
    for (const Variant& v : variants())
      if (name == v.name) t = Tokenizer::create(vocab_from_gguf(*GgufFile::open(write_variant(v, variant_dir()))));
    if (!t) throw std::runtime_error("no variant " + name);
  }
  return *t;
}

// --------------------------------------------------------------- inputs

std::string unhex(const std::string& h) {
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) s += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return s;
}

struct Inputs {
  std::vector<std::string> plain;    // no BOS, special text not parsed
  std::vector<std::string> special;  // BOS as the vocabulary says, special text parsed
};

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs r;
    const std::string inp = test::read_file(test::shared(std::string(kGpt2) + ".inp"));
    const std::string sep = "\n__ggml_vocab_test__\n";
    for (size_t pos = 0, at; (at = inp.find(sep, pos)) != std::string::npos; pos = at + sep.size())
      r.plain.push_back(inp.substr(pos, at - pos));
    const json c = json::parse(test::read_file(kDir + "cases.json"));
    const std::string page = test::read_file(test::shared(c.at("shared_text").at("path").get<std::string>()));
    r.plain.push_back(page.substr(0, c.at("shared_text").at("bytes").get<size_t>()));
    for (const auto& t : c.at("texts")) r.plain.push_back(t.get<std::string>());
    for (const auto& h : c.at("hex")) r.plain.push_back(unhex(h.get<std::string>()));
    for (const auto& t : c.at("special")) r.special.push_back(t.get<std::string>());
    return r;
  }();
  return in;
}

// FNV-1a over the inputs, so data recorded for other inputs is noticed.
std::string fingerprint(const std::vector<std::string>& texts) {
  uint64_t h = 1469598103934665603ull;
  for (const std::string& t : texts) {
    for (unsigned char c : t) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xFF) * 1099511628211ull;  // a byte no UTF-8 text has ends each input
  }
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

const json& peer() {
  static const json j = json::parse(test::read_file(kDir + "peer_ids.json"));
  return j;
}

std::string show(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\\') o += char(c);
    else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02X", c);
      o += b;
    }
  }
  return o.size() > 120 ? o.substr(0, 120) + "..." : o;
}

std::string ids_str(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return "[" + s + "]";
}

// ---------------------------------------------------------------- tests

// Each variant is a vocabulary kvserve loads (record_peer_ids.py runs this
// one to have the files written).
TEST(PretokPeer, EveryVariantLoads) {
  for (const Variant& v : variants()) EXPECT_GT(tokenizer(v.name).n_vocab(), 0) << v.name;
  EXPECT_TRUE(tokenizer("llama-bpe").vocab().add_bos);  // the pre-type's default
  EXPECT_FALSE(tokenizer("gpt-4o").vocab().add_bos);
  EXPECT_FALSE(tokenizer("gemma-spm").vocab().add_space_prefix);
  EXPECT_FALSE(tokenizer("phi3-spm").vocab().strip.empty());
  EXPECT_TRUE(tokenizer("llama-spm").vocab().strip.empty());
}

TEST(PretokPeer, DataMatchesTheInputs) {
  EXPECT_EQ(peer().at("plain_fnv").get<std::string>(), fingerprint(inputs().plain))
      << "cases.json changed: run tests/pretok/record_peer_ids.py";
  EXPECT_EQ(peer().at("special_fnv").get<std::string>(), fingerprint(inputs().special));
  // Every variant has the peer's ids, and nothing else does.
  std::vector<std::string> names;
  for (const auto& [k, v] : peer().at("plain").items()) names.push_back(k);
  std::vector<std::string> want;
  for (const Variant& v : variants()) want.push_back(v.name);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
}

void expect_peer_ids(const std::string& variant, bool special) {
  const Tokenizer& tok = tokenizer(variant);
  const std::vector<std::string>& texts = special ? inputs().special : inputs().plain;
  const json& ids = peer().at(special ? "special" : "plain").at(variant);
  ASSERT_EQ(ids.size(), texts.size());
  int same = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int> want = ids[i].get<std::vector<int>>();
    const std::vector<int> got = tok.encode(texts[i], special, special);
    if (got == want) ++same;
    else ADD_FAILURE() << variant << " input #" << i << " \"" << show(texts[i]) << "\"\n  peer    " << ids_str(want)
                       << "\n  kvserve " << ids_str(got);
  }
  std::printf("[ peer ids ] %-15s %s: %d/%zu exact\n", variant.c_str(), special ? "special" : "plain  ", same,
              texts.size());
}

class PretokVariant : public ::testing::TestWithParam<std::string> {};

TEST_P(PretokVariant, PlainTextAsThePeer) { expect_peer_ids(GetParam(), false); }
TEST_P(PretokVariant, SpecialTextAndBosAsThePeer) { expect_peer_ids(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(All, PretokVariant,
                         ::testing::Values("default", "gpt-2", "llama-bpe", "dbrx", "qwen2", "tekken", "gpt-4o",
                                           "llama-bpe-user", "llama-spm", "gemma-spm", "phi3-spm"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// The pre-tokens each rule makes where the rules differ, named, so a change
// that breaks one says which. Where llama.cpp's rule differs from the Hugging
// Face tokenizer it stands for, the peer's pieces are the ones expected here
// (and the ids above hold them too: each text is among the inputs).
std::vector<std::string> pre_split(const std::string& type, const std::string& text) {
  PreTokenizer p(*find_pre_type(type));
  std::vector<std::string> out;
  p.split(text, [&](std::string_view w) { out.emplace_back(w); });
  return out;
}
using Words = std::vector<std::string>;

TEST(PretokPeer, RulesThatSeparateThePreTypes) {
  // Digits: GPT-2 keeps a run, Llama 3 and o200k cut threes, Qwen2 and tekken
  // one each; "default" splits off punctuation runs first and cuts threes.
  EXPECT_EQ(pre_split("gpt-2", "1234567"), (Words{"1234567"}));
  EXPECT_EQ(pre_split("llama-bpe", "1234567"), (Words{"123", "456", "7"}));
  EXPECT_EQ(pre_split("gpt-4o", "1234567"), (Words{"123", "456", "7"}));
  EXPECT_EQ(pre_split("qwen2", "123"), (Words{"1", "2", "3"}));
  EXPECT_EQ(pre_split("tekken", "123"), (Words{"1", "2", "3"}));
  EXPECT_EQ(pre_split("default", "a 1234567!!"), (Words{"a", " ", "123", "456", "7", "!!"}));
  // Contractions: upper case only where the rule ignores case.
  EXPECT_EQ(pre_split("gpt-2", "DON'T"), (Words{"DON", "'", "T"}));
  EXPECT_EQ(pre_split("llama-bpe", "DON'T"), (Words{"DON", "'T"}));
  EXPECT_EQ(pre_split("gpt-4o", "DON'T"), (Words{"DON'T"}));
  // An upper-case contraction before a letter is a piece of its own (not
  // the apostrophe before a word).
  EXPECT_EQ(pre_split("llama-bpe", "DON'Tknow"), (Words{"DON", "'T", "know"}));
  EXPECT_EQ(pre_split("qwen2", "YOU'REright"), (Words{"YOU", "'RE", "right"}));
  // tekken and o200k cut words where the case changes...
  EXPECT_EQ(pre_split("tekken", "XMLHttpRequest"), (Words{"XMLHttp", "Request"}));
  EXPECT_EQ(pre_split("llama-bpe", "XMLHttpRequest"), (Words{"XMLHttpRequest"}));
  // ...but llama.cpp knows the case of ASCII letters only: any other letter
  // is both, so "ÉCOLE" splits after É (Hugging Face: one word).
  EXPECT_EQ(pre_split("tekken", "\xC3\x89" "COLE"), (Words{"\xC3\x89", "COLE"}));
  EXPECT_EQ(pre_split("gpt-4o", " \xC3\x89" "COLE"), (Words{" \xC3\x89", "COLE"}));
  // and it leaves combining marks out of words (Hugging Face: in them).
  EXPECT_EQ(pre_split("tekken", "cafe\xCC\x81"), (Words{"cafe", "\xCC\x81"}));
  // Letters of Unicode 15.1 (CJK extension I) are letters, whatever PCRE2's
  // own Unicode version is.
  EXPECT_EQ(pre_split("qwen2", "x\xF0\xAE\xAF\xB0\xF0\xAE\xAF\xB1y"), (Words{"x\xF0\xAE\xAF\xB0\xF0\xAE\xAF\xB1y"}));
  // Non-ASCII white space is white space; new lines end a run of it.
  EXPECT_EQ(pre_split("llama-bpe", "a\xC2\xA0\xC2\xA0" "b\n\n c"), (Words{"a", "\xC2\xA0", "\xC2\xA0" "b", "\n\n", " c"}));
}

// -------------------------------------------------------------- refusals

TEST(PretokPeer, UnknownPreTypeIsRefusedAtLoad) {
  const std::string bad = test::temp_dir() + "/bad-pre.gguf";
  test::rewrite_gguf(test::shared(kGpt2), bad, [](GgufWriter& w) { w.set_str("tokenizer.ggml.pre", "no-such-pre"); },
                     nullptr);
  const std::string msg = test::model_error([&] { vocab_from_gguf(*GgufFile::open(bad)); });
  EXPECT_NE(msg.find("key 'tokenizer.ggml.pre' = 'no-such-pre' names a pre-tokenizer kvserve does not know"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("known: " + known_pre_types() + ")"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpt-4o"), std::string::npos) << msg;
  // kvserve tokenize reads vocabulary-only files.
  std::string out, err;
  EXPECT_NE(test::run_kvserve({"tokenize", "-m", bad, "-p", "hello"}, &out, &err), 0);
  EXPECT_NE(err.find("'tokenizer.ggml.pre' = 'no-such-pre'"), std::string::npos) << err;
  // The loader of every other command (generate, serve with its /tokenize,
  // chat, ...) refuses a whole model with that vocabulary.
  const std::string model = test::temp_dir() + "/gpt2-vocab-model.gguf", bad_model = test::temp_dir() + "/bad-pre-model.gguf";
  ASSERT_EQ(test::run_kvserve({"make-model", "-o", model, "--vocab-from", test::shared(kGpt2), "--dim", "64",
                               "--layers", "1", "-q"}, &out, &err), 0) << err;
  test::rewrite_gguf(model, bad_model, [](GgufWriter& w) { w.set_str("tokenizer.ggml.pre", "no-such-pre"); }, nullptr);
  EXPECT_NE(test::model_error([&] { Model::load(bad_model); }).find("'tokenizer.ggml.pre' = 'no-such-pre'"),
            std::string::npos);
  EXPECT_NE(test::run_kvserve({"serve", "-m", bad_model, "--port", "0"}, &out, &err), 0);
  EXPECT_NE(err.find("'tokenizer.ggml.pre' = 'no-such-pre'"), std::string::npos) << err;
  // A SentencePiece vocabulary has no pre-tokenizer: the key means nothing
  // there (llama.cpp ignores it too).
  const std::string spm = test::temp_dir() + "/spm-pre.gguf";
  test::rewrite_gguf(test::shared(kSpm), spm, [](GgufWriter& w) { w.set_str("tokenizer.ggml.pre", "no-such-pre"); },
                     nullptr);
  EXPECT_EQ(test::model_error([&] { vocab_from_gguf(*GgufFile::open(spm)); }), "");
}

// kvserve tokenize reads the same file the same way: BOS from the pre-type's
// default, ids as the peer's.
TEST(PretokPeer, TokenizeCommandUsesTheSamePath) {
  tokenizer("llama-bpe");  // writes the file
  const std::string& text = inputs().special.at(0);
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"tokenize", "-m", variant_dir() + "/llama-bpe.gguf", "-p", text, "--special", "--json"},
                              &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out).at("tokens").get<std::vector<int>>(),
            peer().at("special").at("llama-bpe").at(0).get<std::vector<int>>());
}

// make-model writes the pre-type it is given, and refuses one it does not know.
TEST(PretokPeer, MakeModelTokenizerPre) {
  const std::string m = test::temp_dir() + "/tekken-model.gguf";
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"make-model", "-o", m, "--vocab-from", test::shared(kGpt2), "--tokenizer-pre", "tekken",
                               "--dim", "64", "--layers", "1", "-q"}, &out, &err), 0) << err;
  const Vocab v = vocab_from_gguf(*GgufFile::open(m));
  EXPECT_EQ(v.pre, "tekken");
  EXPECT_TRUE(v.add_bos);
  EXPECT_NE(test::run_kvserve({"make-model", "-o", m, "--vocab-from", test::shared(kGpt2), "--tokenizer-pre", "nope",
                               "-q"}, &out, &err), 0);
  EXPECT_NE(err.find("unknown --tokenizer-pre 'nope'"), std::string::npos) << err;
  EXPECT_NE(test::run_kvserve({"make-model", "-o", m, "--vocab-from", test::shared(kSpm), "--tokenizer-pre", "qwen2",
                               "-q"}, &out, &err), 0);
  EXPECT_NE(err.find("needs a gpt2"), std::string::npos) << err;
}

}  // namespace
}  // namespace kvs
