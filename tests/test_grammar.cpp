// The grammar engine: GBNF parsing (and its errors, by line), the matcher on
// accepted and rejected strings, JSON schemas compiled to grammars (and the
// keywords they refuse), the token mask against a brute-force check of
// every token, and a fork that copies the state.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"

using namespace kvs::grammar;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

Matcher start(const std::string& gbnf) {
  return Matcher(std::make_shared<StackArena>(std::make_shared<const Grammar>(parse_gbnf(gbnf))));
}

// Whole-string match: every byte accepted and the grammar may end there.
bool full(const std::string& gbnf, const std::string& s) {
  Matcher m = start(gbnf);
  return m.accept(s) && m.can_end();
}

std::string error_of(const std::string& gbnf) {
  try {
    parse_gbnf(gbnf);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Gbnf, LiteralsClassesGroupsAndRepetition) {
  const std::string g = R"(root ::= answer ws   # a comment
answer ::= "yes" | "no" | [0-9]+ ("." [0-9]{1,3})?
ws ::= [ \t\n]*)";
  for (const char* ok : {"yes", "no", "42", "3.14", "0.5  ", "7.123\n"}) EXPECT_TRUE(full(g, ok)) << ok;
  for (const char* bad : {"", "ye", "yesno", "3.", "1.2345", "-1", "x"}) EXPECT_FALSE(full(g, bad)) << bad;
  // A prefix is accepted (the grammar continues) but cannot end there.
  Matcher m = start(g);
  EXPECT_TRUE(m.accept("3."));
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept("x"));  // refused bytes leave the state as it was
  EXPECT_TRUE(m.accept("5"));
  EXPECT_TRUE(m.can_end());
  // Negated classes, any char, escapes, multi-line alternatives, {m,} and {m}.
  const std::string h = "root ::= \"<\" [^>\\n]{2,} \">\" . x\nx ::= \"\\u00e9\"{2}\n  | \"\\x41\"";
  EXPECT_TRUE(full(h, "<ab>!\xC3\xA9\xC3\xA9"));
  EXPECT_TRUE(full(h, "<abc>\xE2\x82\xAC" "A"));  // . is one whole code point
  EXPECT_FALSE(full(h, "<a>!A"));
  EXPECT_FALSE(full(h, "<a\nb>!A"));
  EXPECT_TRUE(full("root ::= (\"a\" | \"b\")* \"c\"", "ababbc"));
  EXPECT_TRUE(full("root ::= \"ab\"?  \"c\"", "c"));
  EXPECT_FALSE(full("root ::= \"ab\"?  \"c\"", "ac"));
}

// Strict UTF-8, as the detokenizer: an overlong form of '{' or a surrogate
// is not a character, whatever the grammar would accept.
TEST(Gbnf, StrictUtf8) {
  const std::string any = "root ::= [^\"]*";
  EXPECT_TRUE(full(any, "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"));
  for (const char* bad : {"\xE0\x81\xBB", "\xC1\xBB", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80", "\xFF"})
    EXPECT_FALSE(full(any, bad)) << "bytes of length " << std::string(bad).size();
  Matcher m = start(any);
  EXPECT_FALSE(m.accept("\xE0\x81")) << "no completion of E0 81 is valid";
  EXPECT_TRUE(m.accept("\xE0\xA0"));  // E0 A0 80..BF are valid
}

TEST(Gbnf, ErrorsNameTheLine) {
  EXPECT_NE(error_of("root ::= a\n").find("'a' is used but never defined"), std::string::npos);
  EXPECT_NE(error_of("root ::= root \"x\" | \"y\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= a\na ::= b \"x\"\nb ::= \"\" | a").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"x\"\n\nfoo ::= \"ab").find("line 3"), std::string::npos) << error_of("root ::= \"x\"\n\nfoo ::= \"ab");
  EXPECT_NE(error_of("root ::= \"unterminated").find("line 1"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"x\"{3,1}").find("n < m"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"x\" \nroot ::= \"y\"").find("defined twice"), std::string::npos);
  EXPECT_NE(error_of("other ::= \"x\"").find("no rule named 'root'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
}

TEST(JsonSchema, StrictObjectsEnumsArraysRefsAnyOf) {
  const ojson schema = ojson::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 5},
      "kind": {"enum": ["cat", "dog", 3, null]},
      "tags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
      "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
      "n": {"type": "integer"}
    },
    "required": ["name", "kind", "tags", "next"],
    "additionalProperties": false,
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"}}, "required": ["v"]}}
  })");
  const std::string g = json_schema_gbnf(schema);
  for (const char* ok : {R"({"name": "ab", "kind": "cat", "tags": [true], "next": null})",
                         R"({"name":"","kind":3,"tags":[false, true],"next":{"v":-1.5e3},"n":-7})",
                         " {\"name\": \"x\\n\", \"kind\": null, \"tags\": [true], \"next\": {\"v\": 0}}\n"})
    EXPECT_TRUE(full(g, ok)) << ok;
  for (const char* bad : {R"({"name": "abcdef", "kind": "cat", "tags": [true], "next": null})",  // too long
                          R"({"kind": "cat", "name": "a", "tags": [true], "next": null})",        // out of order
                          R"({"name": "a", "kind": "cow", "tags": [true], "next": null})",        // not in the enum
                          R"({"name": "a", "kind": "cat", "tags": [], "next": null})",            // minItems
                          R"({"name": "a", "kind": "cat", "tags": [true,true,true], "next": null})",
                          R"({"name": "a", "kind": "cat", "tags": [true], "next": null, "x": 1})",  // extra key
                          R"({"name": "a", "kind": "cat", "tags": [true]})",                          // required
                          R"({"name": "a", "kind": "cat", "tags": [true], "next": {"v": 01}})"})
    EXPECT_FALSE(full(g, bad)) << bad;
  EXPECT_TRUE(full(json_object_gbnf(), R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(full(json_object_gbnf(), R"([1, 2])"));
  // Outside the subset: a 400-worthy error naming the keyword.
  for (const char* k : {"pattern", "format", "minimum", "oneOf", "allOf", "patternProperties"}) {
    ojson s = {{"type", "string"}};
    s[k] = k == std::string("minimum") ? json(1) : json("x");
    try {
      json_schema_gbnf(s);
      ADD_FAILURE() << k << " accepted";
    } catch (const GrammarError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + k + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(json_schema_gbnf(ojson::parse(R"({"$ref": "#/$defs/none"})")), GrammarError);
  EXPECT_THROW(json_schema_gbnf(ojson::parse(R"({"type": "object", "properties": {"a": {"type": "string"}},
                                                 "additionalProperties": true})")),
               GrammarError);
}

// Deep grammars are refused when they are built, with a message that says
// what to change, before any matcher or server thread recurses into them:
// a chain of rules before the first character (one past the bound fails,
// the bound itself passes), a long left-recursive cycle (named), and JSON
// schemas nested past their limit.
TEST(Gbnf, DeepGrammarsAreRefusedAtBuild) {
  auto chain = [](int n) {
    std::string g = "root ::= r0\n";
    for (int i = 0; i < n; ++i) g += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
    return g + "r" + std::to_string(n) + " ::= \"a\"\n";
  };
  // root + r0..rn: n + 2 rules deep.
  EXPECT_TRUE(full(chain(int(Grammar::kMaxLeadingDepth) - 2), "a"));
  EXPECT_NE(error_of(chain(int(Grammar::kMaxLeadingDepth) - 1)).find("nests more than 1000 rules deep"), std::string::npos)
      << error_of(chain(int(Grammar::kMaxLeadingDepth) - 1));
  EXPECT_NE(error_of(chain(5000)).find("flatten the grammar"), std::string::npos);
  std::string cycle = "root ::= c0\n";
  for (int i = 0; i < 20000; ++i) cycle += "c" + std::to_string(i) + " ::= c" + std::to_string((i + 1) % 20000) + " | \"b\"\n";
  EXPECT_NE(error_of(cycle).find("left-recursive"), std::string::npos);
  auto nested = [](int depth, const std::string& key) {  // built from the top down: no copies
    ojson root;
    ojson* at = &root;
    for (int i = 0; i < depth; ++i)
      if (key == "items") {
        (*at)["type"] = "array";
        at = &(*at)["items"];
      } else {
        (*at)["anyOf"] = ojson::array({ojson::object()});
        at = &(*at)["anyOf"][0];
      }
    *at = {{"type", "integer"}};
    return root;
  };
  EXPECT_TRUE(full(json_schema_gbnf(nested(40, "items")), "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[7]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"));
  for (const char* key : {"items", "anyOf"}) {
    try {
      json_schema_gbnf(nested(5000, key));
      ADD_FAILURE() << key << " nested 5000 deep accepted";
    } catch (const GrammarError& e) {
      EXPECT_NE(std::string(e.what()).find("nest more than 64 levels"), std::string::npos) << e.what();
    }
  }
}

// Right recursion (what `*` and `+` compile to) returns straight to its
// parent, so a repetition far longer than the matcher's depth guard
// matches, and so does a long run of optional items.
TEST(Gbnf, LongRepetitionsMatch) {
  const std::string many(3 * StackArena::kMaxDepth, 'a');
  EXPECT_TRUE(full("root ::= [a]*", many));
  EXPECT_TRUE(full("root ::= (\"a\" | \"b\")+ \".\"", many + "b."));
  EXPECT_TRUE(full(R"(root ::= "[" item ("," item)* "]"
item ::= [0-9]+)", "[" + std::string(20000, '1') + ",2,3]"));
}

// The mask from the trie walk equals trying every token on a copy of the
// matcher, over random vocabularies (multi-byte characters split across
// tokens included) and states along random accepted texts.
TEST(TokenMask, EqualsTryingEveryToken) {
  const std::string g = json_schema_gbnf(ojson::parse(
      "{\"type\": \"object\", \"properties\": {\"k\xC3\xA9y\": {\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}},"
      " \"required\": [\"n\"]}"));
  std::mt19937 rng(7);
  const std::string alphabet = "{}\":, 0123456789-kyn\xC3\xA9\xE2\x82\xAC\\\n";
  std::vector<std::string> pieces = {"", "{", "}", "\"", "\"n\"", ":", " ", "1", "23", "\xC3", "\xA9", "\xC3\xA9",
                                     "\xE0", "\x81\xBB", "\xE0\x81", "\xC0\xBB", "\xED\xA0", "\xF4\x90"};
  for (int i = 0; i < 400; ++i) {
    std::string p;
    const int len = 1 + int(rng() % 4);
    for (int k = 0; k < len; ++k) p += alphabet[rng() % alphabet.size()];
    pieces.push_back(p);
  }
  const VocabTrie trie(pieces);
  auto arena = std::make_shared<StackArena>(std::make_shared<const Grammar>(parse_gbnf(g)));
  for (int walk = 0; walk < 20; ++walk) {
    Matcher m(arena);
    for (int step = 0; step < 30; ++step) {
      const std::vector<uint64_t> mask = allowed_tokens(m, trie);
      std::vector<int32_t> allowed;
      for (size_t t = 0; t < pieces.size(); ++t) {
        Matcher c = m;
        const bool ok = !pieces[t].empty() && c.accept(pieces[t]);
        EXPECT_EQ(mask_has(mask, int32_t(t)), ok) << "token " << t << " '" << pieces[t] << "' step " << step;
        if (ok) allowed.push_back(int32_t(t));
      }
      if (allowed.empty()) break;
      const int32_t pick = allowed[rng() % allowed.size()];
      Matcher before = m;  // a fork: the copy keeps its own state
      ASSERT_TRUE(m.accept(pieces[size_t(pick)]));
      EXPECT_EQ(allowed_tokens(before, trie), mask);
    }
  }
}
