// Tokenizer tests: llama.cpp's vocab test vectors (SPM and GPT-2 byte-level
// BPE) must match exactly, the stories260K / peer prompts must reproduce the
// goldens' prompt_tokens, decoding must round-trip, and the streaming
// detokenizer must never emit a partial character.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/gguf.h"
#include "model/vocab_loaders.h"
#include "test_util.h"
#include "tokenizer/gpt2.h"
#include "tokenizer/pre_type.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace kvs {
namespace {

using test::read_file;
using test::shared;

// ---------------------------------------------------------------- helpers

std::string printable(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '"') out += "\\\"";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string ids_str(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return "[" + s + "]";
}

struct Vectors {
  std::vector<std::string> texts;
  std::vector<std::vector<int>> ids;
};

// X.gguf.inp: every test string is followed by "\n__ggml_vocab_test__\n"
// (so the empty string is an empty line and "\n\n" is two blank lines);
// X.gguf.out: one line of ids per string.
Vectors load_vectors(const std::string& gguf) {
  const std::string inp = read_file(gguf + ".inp"), outp = read_file(gguf + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  Vectors v;
  size_t pos = 0;
  while (pos < inp.size()) {
    const size_t at = inp.find(sep, pos);
    if (at == std::string::npos) throw std::runtime_error(gguf + ".inp: text after the last separator");
    v.texts.push_back(inp.substr(pos, at - pos));
    pos = at + sep.size();
  }
  std::istringstream lines(outp);
  std::string line;
  while (v.ids.size() < v.texts.size() && std::getline(lines, line)) {
    std::istringstream ls(line);
    std::vector<int> ids;
    int id;
    while (ls >> id) ids.push_back(id);
    v.ids.push_back(ids);
  }
  if (v.ids.size() != v.texts.size())
    throw std::runtime_error(gguf + ": " + std::to_string(v.texts.size()) + " strings but " +
                             std::to_string(v.ids.size()) + " id lines");
  return v;
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& rel) {
  auto f = GgufFile::open(shared(rel));
  return Tokenizer::create(vocab_from_gguf(*f));
}

const Tokenizer& spm() {
  static auto t = load_gguf_tokenizer("golden/tokenizer/ggml-vocab-llama-spm.gguf");
  return *t;
}
const Tokenizer& gpt2() {
  static auto t = load_gguf_tokenizer("golden/tokenizer/ggml-vocab-gpt-2.gguf");
  return *t;
}

int run_vectors(const Tokenizer& tok, const std::string& rel) {
  const Vectors v = load_vectors(shared(rel));
  int ok = 0;
  for (size_t i = 0; i < v.texts.size(); ++i) {
    const std::vector<int> got = tok.encode(v.texts[i], /*add_bos=*/false);
    if (got == v.ids[i]) {
      ++ok;
    } else {
      ADD_FAILURE() << rel << " string #" << i << " " << printable(v.texts[i]) << "\n  expected " << ids_str(v.ids[i])
                    << "\n  actual   " << ids_str(got);
    }
  }
  std::printf("[ vectors  ] %s: %d/%zu exact\n", rel.c_str(), ok, v.texts.size());
  EXPECT_EQ(ok, static_cast<int>(v.texts.size()));
  return ok;
}

// --------------------------------------------------------- vocab loading

// The one token-id range rule (engine, scheduler and server share it).
TEST(Vocab, TokenIdRange) {
  EXPECT_TRUE(token_in_vocab(0, 3));
  EXPECT_TRUE(token_in_vocab(2, 3));
  EXPECT_FALSE(token_in_vocab(3, 3));
  EXPECT_FALSE(token_in_vocab(-1, 3));
  const std::vector<int32_t> ok = {0, 1, 2}, bad = {0, 5, -1};
  EXPECT_EQ(first_token_outside_vocab(ok, 3), -1);
  EXPECT_EQ(first_token_outside_vocab(bad, 3), 1);
  EXPECT_EQ(first_token_outside_vocab(std::span<const int32_t>(bad).subspan(2), 3), 0);
  EXPECT_EQ(first_token_outside_vocab({}, 3), -1);
}

TEST(VocabGguf, LlamaSpmMetadata) {
  auto f = GgufFile::open(shared("golden/tokenizer/ggml-vocab-llama-spm.gguf"));
  const Vocab v = vocab_from_gguf(*f);
  EXPECT_EQ(v.kind, VocabKind::Spm);
  EXPECT_EQ(v.size(), 32000u);
  EXPECT_EQ(v.scores.size(), 32000u);
  EXPECT_EQ(v.types.size(), 32000u);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_EQ(v.unk, 0);
  EXPECT_EQ(v.pad, -1);
  EXPECT_TRUE(v.add_bos);
  EXPECT_FALSE(v.add_eos);
  EXPECT_TRUE(v.add_space_prefix);
  EXPECT_EQ(v.tokens[1], "<s>");
}

TEST(VocabGguf, Gpt2Metadata) {
  auto f = GgufFile::open(shared("golden/tokenizer/ggml-vocab-gpt-2.gguf"));
  const Vocab v = vocab_from_gguf(*f);
  EXPECT_EQ(v.kind, VocabKind::Gpt2);
  EXPECT_EQ(v.pre, "gpt-2");
  EXPECT_EQ(v.size(), 50257u);
  EXPECT_EQ(v.merges.size(), 50000u);
  EXPECT_EQ(v.bos, 50256);
  EXPECT_EQ(v.eos, 50256);
  EXPECT_FALSE(v.add_bos);  // llama.cpp's default for gpt2
}

TEST(VocabGguf, Stories260KUnsetIdsAreNone) {
  // padding_token_id is stored as 0xFFFFFFFF ("unset").
  auto f = GgufFile::open(shared("models/stories260K/stories260K.gguf"));
  const Vocab v = vocab_from_gguf(*f);
  EXPECT_EQ(v.size(), 512u);
  EXPECT_EQ(v.pad, -1);
  EXPECT_EQ(v.bos, 1);
  EXPECT_TRUE(v.add_bos);  // key absent: the llama default
}

// ------------------------------------------------------- llama.cpp vectors

TEST(TokenizerVectors, LlamaSpm) { run_vectors(spm(), "golden/tokenizer/ggml-vocab-llama-spm.gguf"); }
TEST(TokenizerVectors, Gpt2) { run_vectors(gpt2(), "golden/tokenizer/ggml-vocab-gpt-2.gguf"); }

TEST(TokenizerVectors, VectorFileParsing) {
  const Vectors v = load_vectors(shared("golden/tokenizer/ggml-vocab-gpt-2.gguf"));
  ASSERT_EQ(v.texts.size(), 46u);
  EXPECT_EQ(v.texts[0], "ied 4 \xC2\xBD months");
  EXPECT_EQ(v.texts[2], "");
  EXPECT_TRUE(v.ids[2].empty());
  EXPECT_EQ(v.texts[7], "\n");
  EXPECT_EQ(v.texts[8], "\n\n");
  EXPECT_EQ(v.texts[9], "\n\n\n");
}

TEST(TokenizerRoundTrip, Gpt2IsLossless) {
  const Vectors v = load_vectors(shared("golden/tokenizer/ggml-vocab-gpt-2.gguf"));
  for (const std::string& s : v.texts) EXPECT_EQ(gpt2().decode(gpt2().encode(s, false)), s) << printable(s);
}

TEST(TokenizerRoundTrip, SpmWithBosDropsThePrefixSpace) {
  // With BOS first, the added leading space is dropped again on decode; byte
  // fallback makes every string representable.
  const Vectors v = load_vectors(shared("golden/tokenizer/ggml-vocab-llama-spm.gguf"));
  for (const std::string& s : v.texts) {
    const std::vector<int> ids = spm().encode(s, true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(spm().decode(ids), s) << printable(s);
  }
  // Without BOS the prefix space stays visible, as in llama.cpp.
  EXPECT_EQ(spm().decode(spm().encode("Hello world", false)), " Hello world");
}

TEST(TokenizerRoundTrip, InvalidUtf8DoesNotCrash) {
  const std::string bad[] = {"\xFF", "abc\xC3", "\xC3(", "\xE2\x82", "x\xED\xA0\x80y", "\x80\x80 \xF4\x90\x80\x80!",
                             std::string("a\0b", 3)};
  for (const std::string& s : bad) {
    EXPECT_EQ(gpt2().decode(gpt2().encode(s, false)), lenient_utf8(s)) << printable(s);
    EXPECT_EQ(spm().decode(spm().encode(s, true)), s) << printable(s);
  }
}

// ------------------------------------------------------------ golden prompts

TEST(TokenizerGolden, Stories260KGguf) {
  auto tok = load_gguf_tokenizer("models/stories260K/stories260K.gguf");
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(shared("golden/stories260K"))) {
    if (e.path().extension() != ".json") continue;
    const auto j = nlohmann::json::parse(read_file(e.path().string()));
    const std::vector<int> want = j.at("prompt_tokens").get<std::vector<int>>();
    const std::string prompt = j.at("prompt").get<std::string>();
    EXPECT_EQ(ids_str(tok->encode(prompt, true)), ids_str(want)) << e.path().filename() << " " << printable(prompt);
    ++n;
  }
  EXPECT_GE(n, 5);
}

TEST(TokenizerGolden, Stories260KLlama2cTokenizerFile) {
  const auto path = shared("models/stories260K/tok512.bin");
  Vocab v = read_llama2c_vocab(path, 512);
  auto tok = Tokenizer::create(v);
  auto ref = load_gguf_tokenizer("models/stories260K/stories260K.gguf");
  for (const auto& e : std::filesystem::directory_iterator(shared("golden/stories260K"))) {
    if (e.path().extension() != ".json") continue;
    const auto j = nlohmann::json::parse(read_file(e.path().string()));
    const std::vector<int> want = j.at("prompt_tokens").get<std::vector<int>>();
    const std::string prompt = j.at("prompt").get<std::string>();
    const std::vector<int> got = tok->encode(prompt, true);
    EXPECT_EQ(ids_str(got), ids_str(want)) << e.path().filename();
    EXPECT_EQ(tok->decode(got), prompt);
    EXPECT_EQ(ref->decode(got), prompt);
  }
  EXPECT_TRUE(tok->is_eog(2));
  if (v.llama2c) {
    EXPECT_TRUE(tok->is_eog(1));  // llama2.c: a generated BOS ends the story
  }
}

std::vector<int> golden_prompt(const std::string& rel) {
  return nlohmann::json::parse(read_file(shared(rel))).at("prompt_tokens").get<std::vector<int>>();
}

const char* kP1 = "The quick brown fox jumps over the lazy dog.";
const char* kP2 = "Paged attention splits the KV cache into blocks of 16 tokens; prefix sharing saves memory.";

TEST(TokenizerGolden, PeerQwen2Gpt2Vocab) {
  auto tok = load_gguf_tokenizer("models/tiny-random/tiny-qwen2-q8_0.gguf");
  EXPECT_EQ(ids_str(tok->encode(kP1, true)), ids_str(golden_prompt("golden/peer/tiny-qwen2-q8_0.p1.exact.json")));
  EXPECT_EQ(ids_str(tok->encode(kP2, true)), ids_str(golden_prompt("golden/peer/tiny-qwen2-q8_0.p2.exact.json")));
  EXPECT_EQ(tok->decode(tok->encode(kP2, true)), kP2);
}

TEST(TokenizerGolden, PeerLlamaSpmVocab) {
  auto tok = load_gguf_tokenizer("models/tiny-random/tiny-llama-f16.gguf");
  EXPECT_EQ(ids_str(tok->encode(kP1, true)), ids_str(golden_prompt("golden/peer/tiny-llama-f16.p1.exact.json")));
  EXPECT_EQ(ids_str(tok->encode(kP2, true)), ids_str(golden_prompt("golden/peer/tiny-llama-f16.p2.exact.json")));
  EXPECT_EQ(tok->decode(tok->encode(kP2, true)), kP2);
}

// ---------------------------------------------------- special tokens, EOG

TEST(TokenizerSpecial, ControlTextOnlyWithParseSpecial) {
  EXPECT_EQ(ids_str(gpt2().encode("<|endoftext|>", false, true)), "[50256]");
  const std::vector<int> literal = gpt2().encode("<|endoftext|>", false, false);
  EXPECT_GT(literal.size(), 1u);
  EXPECT_EQ(gpt2().decode(literal), "<|endoftext|>");
  // SPM: the space prefix applies to each run of text after a special token.
  const std::vector<int> hello = spm().encode("Hello", false);
  std::vector<int> want = {1};
  want.insert(want.end(), hello.begin(), hello.end());
  want.push_back(2);
  EXPECT_EQ(ids_str(spm().encode("<s>Hello</s>", false, true)), ids_str(want));
  EXPECT_EQ(spm().decode({1, 2}), "");  // control tokens contribute no text
}

TEST(TokenizerSpecial, EndOfGeneration) {
  EXPECT_TRUE(gpt2().is_eog(50256));
  EXPECT_FALSE(gpt2().is_eog(464));
  EXPECT_TRUE(spm().is_eog(2));
  EXPECT_FALSE(spm().is_eog(1));
  EXPECT_FALSE(spm().is_eog(-1));
  EXPECT_FALSE(spm().is_eog(32000));
}

TEST(TokenizerSpecial, Gpt2ByteTable) {
  const auto& t = gpt2_byte_to_cp();
  EXPECT_EQ(t[' '], 0x120u);  // 'Ġ'
  EXPECT_EQ(t['\n'], 0x10Au);  // 'Ċ'
  EXPECT_EQ(t['A'], static_cast<uint32_t>('A'));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(gpt2_cp_to_byte(t[static_cast<size_t>(b)]), b);
}

// ---------------------------------------------------------- pre-tokenizers

std::vector<std::string> pre_split(const std::string& name, std::string_view text) {
  const PreType* t = find_pre_type(name);
  if (!t) throw std::invalid_argument("no pre-type " + name);
  PreTokenizer p(*t);
  std::vector<std::string> out;
  p.split(text, [&](std::string_view w) { out.emplace_back(w); });
  return out;
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, Gpt2Rule) {
  EXPECT_EQ(pre_split("gpt-2", "Hello world's   end 12345\n\n"),
            (Words{"Hello", " world", "'s", "  ", " end", " 12345", "\n\n"}));
}

TEST(PreTokenizer, Llama3AndQwen2Rules) {
  EXPECT_EQ(pre_split("llama3", "Hello, world! 12345\n\nX"),
            (Words{"Hello", ",", " world", "!", " ", "123", "45", "\n\n", "X"}));
  EXPECT_EQ(pre_split("qwen2", "I'M 2024"), (Words{"I", "'M", " ", "2", "0", "2", "4"}));
}

TEST(PreTokenizer, UnknownNamesAreUnknown) {
  EXPECT_EQ(find_pre_type("no-such-pre"), nullptr);
  EXPECT_EQ(find_pre_type("gpt2"), nullptr);  // llama.cpp spells it gpt-2
  ASSERT_NE(find_pre_type(""), nullptr);
  EXPECT_EQ(find_pre_type("")->name, "default");
  const std::string known = known_pre_types();
  for (const char* n : {"default", "gpt-2", "llama-bpe", "llama3", "qwen2", "tekken", "gpt-4o", "dbrx"}) {
    EXPECT_NE(find_pre_type(n), nullptr) << n;
    EXPECT_NE(known.find(n), std::string::npos) << n;
  }
  // A vocabulary built by hand with an unknown name is refused too.
  Vocab v = gpt2().vocab();
  v.pre = "no-such-pre";
  try {
    Tokenizer::create(v);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown pre-tokenizer 'no-such-pre'"), std::string::npos) << e.what();
  }
}

// llama.cpp decodes invalid UTF-8 byte by byte into U+FFFD (overlong and
// surrogate forms are accepted), and the BPE sees that text.
TEST(PreTokenizer, InvalidBytesAreReadAsLlamaCppReadsThem) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(lenient_utf8("ab\xFF\xFE" "cd \xC3"), "ab" + fffd + fffd + "cd " + fffd);
  EXPECT_EQ(lenient_utf8("\xC0\xAF"), "/");                     // overlong: re-encoded
  EXPECT_EQ(lenient_utf8("x\xED\xA0\x80y"), "x\xED\xA0\x80y");  // a surrogate stays
  EXPECT_EQ(lenient_utf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // above U+10FFFF
  EXPECT_EQ(lenient_utf8("\xE2\x82"), fffd + fffd);               // truncated: per byte
  EXPECT_EQ(pre_split("gpt-2", "ab\xFF\xFE" "cd \xC3"), (Words{"ab", fffd + fffd, "cd", " " + fffd}));
}

// ------------------------------------------------------------ detokenizer

TEST(Detokenizer, HoldsSplitCharacterUntilComplete) {
  // SPM byte tokens: <0xNN> is id 3 + NN in the Llama vocab.
  Detokenizer d(spm());
  EXPECT_EQ(d.push(1), "");            // BOS
  EXPECT_EQ(d.push(3 + 0xE2), "");     // first byte of U+20AC
  EXPECT_EQ(d.push(3 + 0x82), "");
  EXPECT_EQ(d.push(3 + 0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(d.flush(), "");
}

TEST(Detokenizer, Gpt2EmojiAcrossTokens) {
  // " this is 🦙.cpp" -> 428 318 12520 99 247 13 20322: the llama emoji is split
  // over three tokens, the first of which also carries a space.
  Detokenizer d(gpt2());
  std::string all;
  std::vector<std::string> parts;
  for (int id : {428, 318, 12520, 99, 247, 13, 20322}) parts.push_back(d.push(id));
  EXPECT_EQ(parts[2], " ");
  EXPECT_EQ(parts[3], "");
  EXPECT_EQ(parts[4], "\xF0\x9F\xA6\x99");
  for (auto& p : parts) all += p;
  all += d.flush();
  EXPECT_EQ(all, " this is \xF0\x9F\xA6\x99.cpp");
}

TEST(Detokenizer, InvalidBytesBecomeReplacementChar) {
  Detokenizer d(spm());
  EXPECT_EQ(d.push(3 + 0xFF), "\xEF\xBF\xBD");  // can never start a character
  EXPECT_EQ(d.push(3 + 0xE2), "");
  EXPECT_EQ(d.push(3 + 0x82), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");        // truncated sequence at the end
  EXPECT_EQ(d.push(3 + 0xC3), "");
  EXPECT_EQ(d.push(3 + 'A'), "\xEF\xBF\xBD" "A");  // broken by a non-continuation byte
}

TEST(Detokenizer, StreamEqualsSanitizedDecode) {
  // Random token streams (biased towards byte tokens so characters get split
  // and broken): the streamed text is valid UTF-8 and equals the replaced
  // whole-string decode.
  std::mt19937 rng(1234);
  for (const Tokenizer* tok : {&spm(), &gpt2()}) {
    for (int round = 0; round < 200; ++round) {
      std::vector<int> ids;
      const int n = 1 + static_cast<int>(rng() % 40);
      for (int i = 0; i < n; ++i) {
        const bool spm_vocab = tok->vocab().kind == VocabKind::Spm;
        ids.push_back(rng() % 2 ? static_cast<int>(rng() % tok->n_vocab())
                                : (spm_vocab ? 3 + static_cast<int>(rng() % 256) : static_cast<int>(rng() % 256)));
      }
      Detokenizer d(*tok);
      std::string streamed;
      for (int id : ids) {
        const std::string part = d.push(id);
        EXPECT_EQ(utf8::sanitize(part), part);
        streamed += part;
      }
      streamed += d.flush();
      EXPECT_EQ(streamed, utf8::sanitize(tok->decode(ids)));
    }
  }
}

TEST(TokenizerRoundTrip, RandomBytes) {
  std::mt19937 rng(99);
  const std::string alphabet[] = {"a", "Z", " ", "  ", "\n", "\t", "'s", "3", "\xC3\xA9", "\xE2\x82\xAC",
                                  "\xF0\x9F\xA6\x99", "\xE2\x96\x81", "\xFF", "\x80", "\xC3", "<s>", "."};
  for (int round = 0; round < 500; ++round) {
    std::string s;
    const int n = static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % std::size(alphabet)];
    EXPECT_EQ(gpt2().decode(gpt2().encode(s, false)), lenient_utf8(s)) << printable(s);
    // U+2581 is SentencePiece's own escape for ' ', so it comes back as a
    // space; unless an invalid lead byte before it swallowed its first byte
    // (llama.cpp cuts characters by the lead byte alone), then its bytes come
    // back as they were.
    auto spaced = [](std::string t) {
      for (size_t p; (p = t.find("\xE2\x96\x81")) != std::string::npos;) t.replace(p, 3, " ");
      return t;
    };
    const std::string back = spm().decode(spm().encode(s, true));
    EXPECT_EQ(spaced(back), spaced(s)) << printable(s);
    if (utf8::sanitize(s) == s) EXPECT_EQ(back, spaced(s)) << printable(s);
  }
}

TEST(Utf8, DecodeRejectsOverlongAndSurrogates) {
  EXPECT_EQ(utf8::sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::sanitize("\xF4\x8F\xBF\xBF"), "\xF4\x8F\xBF\xBF");  // U+10FFFF is fine
  EXPECT_EQ(utf8::sanitize("\xE2\x82"), "\xEF\xBF\xBD");              // one maximal subpart
  EXPECT_EQ(utf8::complete_prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(utf8::complete_prefix("ab\xFF"), 3u);
}

// -------------------------------------------------------------------- CLI

TEST(TokenizeCli, GgufLlama2cAndVocabOnly) {
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"tokenize", "-m", shared("models/stories260K/stories260K.gguf"), "-p", "Once upon a time"},
                              &out, &err), 0) << err;
  EXPECT_EQ(out, "1 403 407 261 378\n");
  // llama2.c checkpoint: tok512.bin beside it is found automatically.
  ASSERT_EQ(test::run_kvserve({"tokenize", "-m", shared("models/stories260K/stories260K.bin"), "-p", "Once upon a time",
                               "--no-bos"}, &out, &err), 0) << err;
  EXPECT_EQ(out, "403 407 261 378\n");
  // Vocab-only GGUF, JSON output.
  ASSERT_EQ(test::run_kvserve({"tokenize", "-m", shared("golden/tokenizer/ggml-vocab-gpt-2.gguf"), "-p", kP1, "--json"},
                              &out, &err), 0) << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("tokens").get<std::vector<int>>(), golden_prompt("golden/peer/tiny-qwen2-q8_0.p1.exact.json"));
  EXPECT_EQ(j.at("pieces").at(1).get<std::string>(), " quick");
}

TEST(TokenizeCli, ErrorsAreClear) {
  std::string out, err;
  EXPECT_NE(test::run_kvserve({"tokenize", "-m", shared("golden/tokenizer/ggml-vocab-gpt-2.gguf")}, &out, &err), 0);
  EXPECT_NE(err.find("-p TEXT or -f FILE"), std::string::npos) << err;
  EXPECT_NE(test::run_kvserve({"tokenize", "-m", shared("golden/tokenizer/ggml-vocab-gpt-2.gguf.inp"), "-p", "x"}, &out,
                              &err), 0);
  EXPECT_NE(err.find("neither GGUF nor a llama2.c checkpoint"), std::string::npos) << err;
}

// ------------------------------------------------------------------ speed

std::string megabyte_of_text() {
  std::string base = read_file(shared("golden/tokenizer/ggml-vocab-gpt-2.gguf.inp"));
  base += "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. ";
  std::string s;
  while (s.size() < (1u << 20)) s += base;
  return s;
}

TEST(TokenizerSpeed, OneMegabyte) {
  const std::string text = megabyte_of_text();
  for (const Tokenizer* tok : {&spm(), &gpt2()}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int> ids = tok->encode(text, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ speed    ] %s: %zu bytes -> %zu tokens in %.3f s (%.1f MB/s)\n",
                tok->vocab().kind == VocabKind::Spm ? "spm " : "gpt2", text.size(), ids.size(), s,
                text.size() / 1e6 / s);
    EXPECT_EQ(tok->decode(ids), tok->vocab().kind == VocabKind::Spm ? " " + text : text);
  }
}

TEST(TokenizerSpeed, PathologicalRunsAreLinearish) {
  // One huge pre-token (letters) and one huge whitespace run: the BPE and
  // the regex must not go quadratic or overflow a stack.
  const std::string letters(1 << 20, 'a'), spaces(1 << 20, ' ');
  for (const std::string* s : {&letters, &spaces}) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(gpt2().decode(gpt2().encode(*s, false)), *s);
    EXPECT_EQ(spm().decode(spm().encode(*s, true)), *s);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ speed    ] 1 MiB run of '%c' (both tokenizers, encode+decode): %.3f s\n", (*s)[0], sec);
  }
}

// For a tool-call parser: control tokens add their own text when asked
// (never BOS), nothing otherwise.
TEST(Detokenizer, ControlTokensTextOnlyWhenAsked) {
  const Tokenizer& t = spm();
  const int eos = t.vocab().eos;
  ASSERT_GE(eos, 0);
  ASSERT_EQ(t.vocab().types.at(size_t(eos)), int32_t(TokenAttr::Control));
  Detokenizer plain(t), marked(t, true);
  EXPECT_EQ(plain.push(1) + plain.push(eos), "");
  EXPECT_EQ(marked.push(1), "");  // BOS stays silent
  EXPECT_EQ(marked.push(eos), t.vocab().tokens.at(size_t(eos)));
}

}  // namespace
}  // namespace kvs
