#include "server/token_endpoints.h"

#include <algorithm>
#include <initializer_list>

#include "server/chat_prompt.h"
#include "server/exchange.h"
#include "server/openai_codec.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace kvs::server {

using nlohmann::json;

namespace {

// The body as an object with only `allowed` fields (400 naming any other).
json body_of(const std::string& body, std::initializer_list<const char*> allowed) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception&) {
    throw bad_request("the request body is not valid JSON");
  }
  if (!j.is_object()) throw bad_request("request body must be a JSON object");
  for (const auto& [k, v] : j.items())
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }))
      throw bad_request("unknown field '" + k + "'", k);
  return j;
}

bool flag(const json& j, const char* k, bool dflt) {
  if (!j.contains(k) || j[k].is_null()) return dflt;
  if (!j[k].is_boolean()) throw bad_request(std::string("'") + k + "' must be true or false", k);
  return j[k].get<bool>();
}

// A piece as text when it is valid UTF-8 on its own, else its bytes (as
// llama-server does for split characters).
bool valid_utf8(std::string_view s) {
  while (!s.empty()) {
    const utf8::Decoded d = utf8::decode(s);
    if (d.status != utf8::Status::Valid) return false;
    s.remove_prefix(d.len);
  }
  return true;
}

json piece_json(const std::string& bytes) {
  if (valid_utf8(bytes)) return bytes;
  json a = json::array();
  for (unsigned char c : bytes) a.push_back(int(c));
  return a;
}

template <class F>
HttpResponse answer(F&& f) {
  try {
    return json_response(200, f());
  } catch (const ApiError& e) {
    return error_response(e);
  }
}

}  // namespace

HttpResponse tokenize_endpoint(const Tokenizer& tok, const std::string& body) {
  return answer([&] {
    const json j = body_of(body, {"content", "add_special", "parse_special", "with_pieces"});
    if (!j.contains("content") || !j["content"].is_string()) throw bad_request("'content' must be a string", "content");
    const std::vector<int> ids = tok.encode(j["content"].get<std::string>(), flag(j, "add_special", false),
                                            flag(j, "parse_special", true));
    json out = json::array();
    if (!flag(j, "with_pieces", false)) {
      for (int id : ids) out.push_back(id);
    } else {
      for (size_t i = 0; i < ids.size(); ++i)
        out.push_back({{"id", ids[i]}, {"piece", piece_json(tok.token_bytes(ids[i], i ? ids[i - 1] : -1))}});
    }
    return json{{"tokens", out}};
  });
}

HttpResponse detokenize_endpoint(const Tokenizer& tok, const std::string& body) {
  return answer([&] {
    const json j = body_of(body, {"tokens"});
    if (!j.contains("tokens") || !j["tokens"].is_array()) throw bad_request("'tokens' must be an array of ids", "tokens");
    std::vector<int32_t> ids;
    for (const json& t : j["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        throw bad_request("'tokens' must be non-negative integer ids", "tokens");
      ids.push_back(int32_t(t.get<int64_t>()));
    }
    if (std::string e = token_ids_error(ids, tok.n_vocab(), "'tokens':"); !e.empty()) throw bad_request(e, "tokens");
    // As llama-server: control tokens (BOS and EOS too) add their own text, so
    // what a prompt holds reads back whole. Unlike llama-server, the space a
    // SentencePiece vocab put before the first word is not part of the text,
    // so /tokenize then /detokenize gives the content back.
    const Vocab& v = tok.vocab();
    std::string text;
    int prev = -1;
    for (int32_t id : ids) {
      const bool control = size_t(id) < v.types.size() && v.types[size_t(id)] == int32_t(TokenAttr::Control);
      text += control ? v.tokens[size_t(id)] : tok.token_bytes(id, prev);
      prev = id;
    }
    if (v.add_space_prefix && !ids.empty() && ids[0] != v.bos && !text.empty() && text[0] == ' ') text.erase(0, 1);
    return json{{"content", text}};
  });
}

HttpResponse apply_template_endpoint(const ChatTemplate& chat, const std::string& body) {
  // The body of a chat request, checked as the chat endpoint checks it; its
  // errors name this route, not the chat one. Beside it, vLLM's
  // add_generation_prompt (default true): false renders the conversation
  // without the assistant turn's opening.
  return answer([&] {
    try {
      std::string chat_body = body;
      bool add_generation_prompt = true;
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(body, nullptr, false);
      if (j.is_object() && j.contains("add_generation_prompt")) {  // else parse_request says what is wrong
        const nlohmann::ordered_json& g = j["add_generation_prompt"];
        if (!g.is_boolean() && !g.is_null())
          throw bad_request("'add_generation_prompt' must be true or false", "add_generation_prompt");
        add_generation_prompt = g.is_boolean() ? g.get<bool>() : true;
        j.erase("add_generation_prompt");
        chat_body = j.dump();  // ordered: the messages keep the client's key order
      }
      return json{{"prompt", chat_prompt(chat, parse_request(Endpoint::Chat, chat_body), add_generation_prompt)}};
    } catch (ApiError e) {
      static const std::string kChat = "/v1/chat/completions";
      if (const size_t at = e.message.find(kChat); at != std::string::npos)
        e.message.replace(at, kChat.size(), "/apply-template");
      throw e;
    }
  });
}

}  // namespace kvs::server
