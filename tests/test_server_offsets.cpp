// kvserve serve on stories260K (a SentencePiece vocabulary: the first word's
// piece carries a space the text does not start with) over real sockets:
// completions logprobs text_offset indexes the returned text with and
// without echo, streamed or not; HEAD /health and the Allow header of a 405.
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "http_client.h"
#include "kvs_process.h"
#include "test_util.h"

using nlohmann::json;

namespace {

std::string stories() { return kvs::test::shared("models/stories260K/stories260K.gguf"); }


kvs::test::HttpReply post(int port, const json& body) {
  return kvs::test::http_request(port, "POST", "/v1/completions", body.dump(), {{"Content-Type", "application/json"}});
}

// The choice's text and its logprobs (streamed: the chunks joined).
struct Choice {
  std::string text;
  json tokens = json::array(), offsets = json::array();
};

Choice choice_of(const kvs::test::HttpReply& r, bool stream) {
  Choice c;
  auto take = [&](const json& ch) {
    c.text += ch["text"].get<std::string>();
    if (ch["logprobs"].is_null()) return;
    for (const json& t : ch["logprobs"]["tokens"]) c.tokens.push_back(t);
    for (const json& o : ch["logprobs"]["text_offset"]) c.offsets.push_back(o);
  };
  if (!stream) {
    take(json::parse(r.body)["choices"][0]);
    return c;
  }
  for (const std::string& d : kvs::test::sse_payloads(r.body))
    if (d != "[DONE]") take(json::parse(d)["choices"][0]);
  return c;
}

// text[text_offset[i]:] starts with tokens[i], for every i.
void expect_offsets_index_the_text(const Choice& c, const std::string& what) {
  ASSERT_EQ(c.tokens.size(), c.offsets.size()) << what;
  ASSERT_FALSE(c.tokens.empty()) << what;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    const size_t off = c.offsets[i];
    const std::string tok = c.tokens[i];
    ASSERT_LE(off, c.text.size()) << what << " token " << i;
    EXPECT_EQ(c.text.compare(off, tok.size(), tok), 0)
        << what << ": token " << i << " '" << tok << "' at " << off << " of '" << c.text << "'";
  }
}

}  // namespace

TEST(ServerOffsets, TextOffsetIndexesTheTextEchoedOrStreamed) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared is not available";
  kvs::test::ServeProcess s({"--threads", "2", "-m", stories()});
  for (bool echo : {false, true}) {
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 1},
                       {"echo", echo}};
    const kvs::test::HttpReply whole = post(s.port(), body);
    ASSERT_EQ(whole.status, 200) << whole.body;
    const Choice w = choice_of(whole, false);
    const std::string what = echo ? "echo" : "plain";
    expect_offsets_index_the_text(w, what);
    if (echo) {
      EXPECT_EQ(w.text.rfind("Once upon a time", 0), 0u) << w.text;
      EXPECT_EQ(w.tokens[1], "Once");  // after BOS, without the piece's space
    } else {
      EXPECT_EQ(w.offsets[0], 0);
    }
    json sb = body;
    sb["stream"] = true;
    const kvs::test::HttpReply streamed = post(s.port(), sb);
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    const Choice st = choice_of(streamed, true);
    EXPECT_EQ(st.text, w.text) << what;
    EXPECT_EQ(st.tokens, w.tokens) << what;
    EXPECT_EQ(st.offsets, w.offsets) << what;
  }
  EXPECT_EQ(s.stop(), 0);
}

TEST(ServerOffsets, HeadHealthAndAllowOn405) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared is not available";
  kvs::test::ServeProcess s({"--threads", "2", "-m", stories()});
  // HEAD: the head of GET's reply, no body (raw: the test client expects one).
  const int fd = kvs::test::connect_local(s.port(), 10);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(kvs::test::send_all(fd, "HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, size_t(n));
  close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  const size_t end = got.find("\r\n\r\n");
  ASSERT_NE(end, std::string::npos) << got;
  EXPECT_EQ(end + 4, got.size()) << "a body after the head: " << got;
  EXPECT_NE(got.find("Content-Length: "), std::string::npos) << got;
  for (const auto& [method, path, allow] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GET", "/v1/completions", "POST"}, {"POST", "/v1/models", "GET"}, {"DELETE", "/health", "GET, HEAD"}}) {
    const kvs::test::HttpReply r = kvs::test::http_request(s.port(), method, path);
    EXPECT_EQ(r.status, 405) << method << " " << path;
    EXPECT_EQ(r.headers.count("allow") ? r.headers.at("allow") : "(none)", allow) << method << " " << path;
  }
  EXPECT_EQ(s.stop(), 0);
}

// A stop string completed by the choice's last allowed token: the choice
// ends with "stop" and the usage still counts the prompt and every token
// (the scheduler had already ended the request when the stop was seen).
TEST(ServerOffsets, AStopStringOnTheLastTokenKeepsTheUsage) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared is not available";
  kvs::test::ServeProcess s({"--threads", "2", "-m", stories()});
  const json greedy = {{"prompt", "Once upon a time"}, {"max_tokens", 9}, {"temperature", 0}, {"logprobs", 1}};
  const kvs::test::HttpReply g = post(s.port(), greedy);
  ASSERT_EQ(g.status, 200) << g.body;
  const Choice c = choice_of(g, false);
  ASSERT_GE(c.tokens.size(), 8u);
  // Tokens 7 and 8 make the stop string; it must not occur before token 7.
  const std::string stop = c.tokens[6].get<std::string>() + c.tokens[7].get<std::string>();
  ASSERT_EQ(c.text.find(stop), c.offsets[6].get<size_t>()) << "pick another pair: '" << stop << "' in " << c.text;
  for (bool stream : {false, true}) {
    json body = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}, {"stop", {stop}}};
    if (stream) {
      body["stream"] = true;
      body["stream_options"] = {{"include_usage", true}};
    }
    const kvs::test::HttpReply r = post(s.port(), body);
    ASSERT_EQ(r.status, 200) << r.body;
    json last, usage;
    if (!stream) {
      last = json::parse(r.body)["choices"][0];
      usage = json::parse(r.body)["usage"];
    } else {
      for (const std::string& d : kvs::test::sse_payloads(r.body)) {
        if (d == "[DONE]") continue;
        const json j = json::parse(d);
        if (!j["choices"].empty()) last = j["choices"][0];
        if (!j["usage"].is_null()) usage = j["usage"];
      }
    }
    EXPECT_EQ(last["finish_reason"], "stop") << r.body;
    EXPECT_EQ(usage["completion_tokens"], 8) << "stream " << stream << ": " << r.body;
    EXPECT_GT(usage["prompt_tokens"].get<int>(), 0) << r.body;
  }
  EXPECT_EQ(s.stop(), 0);
}

// A stop string that cuts the text: the logprobs end with the token the kept
// text ends in (between two tokens: "".join(tokens) is the text; inside
// one: that token is the last), streamed or not, and streamed no token's
// logprob arrives before its text. Before, every generated token was listed,
// past the text, and streamed chunks carried logprobs of text never sent.
TEST(ServerOffsets, AStopStringCutsTheLogprobsWithTheText) {
  if (!kvs::test::shared_available()) GTEST_SKIP() << "../shared is not available";
  kvs::test::ServeProcess s({"--threads", "2", "-m", stories()});
  const json greedy = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 1}};
  const kvs::test::HttpReply g = post(s.port(), greedy);
  ASSERT_EQ(g.status, 200) << g.body;
  const Choice all = choice_of(g, false);
  ASSERT_GE(all.tokens.size(), 10u);
  // Tokens 6.. after the cut; the stop string starts with token 6 (whole
  // tokens kept) or one byte into it (token 6 cut inside).
  const std::string t6 = all.tokens[6], t7 = all.tokens[7];
  ASSERT_GE(t6.size(), 2u) << "pick another token: '" << t6 << "'";
  const size_t at6 = all.offsets[6];
  for (const bool inside : {false, true}) {
    const std::string stop = inside ? t6.substr(1) + t7 : t6 + t7;
    ASSERT_EQ(all.text.find(stop), at6 + (inside ? 1 : 0)) << "pick another pair: '" << stop << "' in " << all.text;
    for (const bool stream : {false, true}) {
      json body = greedy;
      body["stop"] = stop;
      body["stream"] = stream;
      const kvs::test::HttpReply r = post(s.port(), body);
      ASSERT_EQ(r.status, 200) << r.body;
      const std::string what = std::string(inside ? "cut inside a token" : "cut between tokens") +
                               (stream ? ", streamed" : "");
      const Choice c = choice_of(r, stream);
      ASSERT_EQ(c.text, all.text.substr(0, at6 + (inside ? 1 : 0))) << what;
      ASSERT_EQ(c.tokens.size(), inside ? 7u : 6u) << what << ": " << c.tokens.dump();
      for (size_t i = 0; i < c.tokens.size(); ++i) EXPECT_EQ(c.tokens[i], all.tokens[i]) << what;
      std::string joined;
      for (const json& t : c.tokens) joined += t.get<std::string>();
      if (!inside) expect_offsets_index_the_text(c, what);
      EXPECT_EQ(joined.substr(0, c.text.size()), c.text) << what;
      for (const json& o : c.offsets) EXPECT_LT(o.get<size_t>(), c.text.size()) << what;
      if (!stream) continue;
      // Each chunk lists only tokens whose text has been sent, with it or before.
      std::string sent;
      for (const std::string& d : kvs::test::sse_payloads(r.body)) {
        if (d == "[DONE]") continue;
        const json ch = json::parse(d)["choices"][0];
        sent += ch["text"].get<std::string>();
        if (ch["logprobs"].is_null() || !ch["finish_reason"].is_null()) continue;
        for (size_t i = 0; i < ch["logprobs"]["tokens"].size(); ++i) {
          const size_t end = ch["logprobs"]["text_offset"][i].get<size_t>() + ch["logprobs"]["tokens"][i].get<std::string>().size();
          EXPECT_LE(end, sent.size()) << what << ": a logprob before its text in " << d;
        }
      }
    }
  }
  EXPECT_EQ(s.stop(), 0);
}
