#include "tools/byte_vocab.h"

#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace kvs {

namespace {

const char* const kWords[] = {
    "the", "and", "a", "to", "was", "once", "upon", "time", "he", "she", "it", "of", "in", "they", "you", "i", "said", "his",
    "her", "that", "with", "on", "for", "is", "but", "had", "so", "at", "one", "day", "little", "big",
    "were", "there", "once", "upon", "time", "named", "very", "play", "happy", "saw", "wanted", "friend",
    "friends", "what", "not", "all", "can", "be", "have", "are", "do", "we", "when", "them", "up", "out",
    "go", "went", "came", "come", "like", "liked", "loved", "love", "mom", "dad", "girl", "boy", "dog",
    "cat", "bird", "tree", "park", "ball", "red", "blue", "green", "sun", "sky", "fun", "good", "nice",
    "help", "helped", "look", "looked", "from", "an", "this", "then", "back", "home", "too", "how",
    "who", "will", "would", "could", "made", "make", "find", "found", "toy", "lily", "tim", "ben", "sam",
    "asked", "about", "their", "him", "me", "my", "your", "our", "after", "again", "always", "together",
    "every", "new", "old", "many", "some", "more", "way", "over", "into", "down", "because", "did",
    "know", "see", "get", "got", "run", "ran", "smiled", "felt", "sad", "thank", "thanks", "yes", "no",
    "quick", "brown", "fox", "jumps", "lazy", "cache", "block", "token", "tokens", "memory", "model",
    "server", "request", "prefix", "attention", "paged", "blocks", "sharing", "saves", "splits",
    "ing", "ed", "er", "ly", "es", "s", "tion", "ment", "ness", "est", "able",
};

const char kChars[] =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()/&%$#@*+=<>[]_";

const std::string kSpace = "\xE2\x96\x81";  // U+2581

}  // namespace

Vocab builtin_byte_vocab(int n_vocab) {
  if (n_vocab < 259)
    throw std::invalid_argument("built-in vocabulary needs at least 259 tokens (3 specials + 256 bytes), got " +
                                std::to_string(n_vocab));
  Vocab v;
  v.kind = VocabKind::Spm;
  v.pre = "default";
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_bos = true;
  v.add_space_prefix = true;
  std::unordered_set<std::string> seen;
  auto add = [&](const std::string& piece, float score, TokenAttr type) {
    if (static_cast<int>(v.tokens.size()) >= n_vocab || !seen.insert(piece).second) return;
    v.tokens.push_back(piece);
    v.scores.push_back(score);
    v.types.push_back(static_cast<int32_t>(type));
  };
  add("<unk>", 0.f, TokenAttr::Unknown);
  add("<s>", 0.f, TokenAttr::Control);
  add("</s>", 0.f, TokenAttr::Control);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 0.f, TokenAttr::Byte);
  }
  // Merge scores decrease with rank, so earlier (more useful) pieces win.
  float score = 0.f;
  auto piece = [&](const std::string& p) {
    add(p, score, TokenAttr::Normal);
    score -= 1.f;
  };
  piece(kSpace);
  for (const char* c = kChars; *c; ++c) piece(std::string(1, *c));
  // Every prefix of "▁word", then "word", then "▁Word": BPE merges left to
  // right reach the full word through pieces that exist. Forms go in that
  // order over the whole list so a small vocabulary gets the common forms.
  for (int form = 0; form < 3; ++form) {
    for (const char* w : kWords) {
      std::string s = w;
      if (form == 2) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
      if (form != 1) s = kSpace + s;
      const size_t start = form != 1 ? kSpace.size() + 1 : 2;
      for (size_t n = start; n <= s.size(); ++n) piece(s.substr(0, n));
    }
  }
  // Fillers for large vocabularies: letter pairs, "▁"+pair, then triples.
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) piece(std::string{a, b});
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) piece(kSpace + std::string{a, b});
  for (char a = 'a'; a <= 'z' && static_cast<int>(v.tokens.size()) < n_vocab; ++a)
    for (char b = 'a'; b <= 'z'; ++b)
      for (char c = 'a'; c <= 'z'; ++c) {
        piece(std::string{a, b, c});
        piece(kSpace + std::string{a, b, c});
      }
  // Anything left (vocabularies beyond ~37k): numbered unused pieces.
  for (int i = 0; static_cast<int>(v.tokens.size()) < n_vocab; ++i)
    add("<extra_" + std::to_string(i) + ">", -1e9f, TokenAttr::Unused);
  return v;
}

}  // namespace kvs
