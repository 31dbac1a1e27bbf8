// llama-server's token endpoints, in its shapes, for clients that count or
// inspect tokens without generating:
//   POST /tokenize        {"content": text, "add_special": bool, "parse_special": bool, "with_pieces": bool}
//                         -> {"tokens": [id, ...]}  or, with pieces, [{"id": id, "piece": text | [bytes]}, ...]
//   POST /detokenize      {"tokens": [id, ...]} -> {"content": text}
//   POST /apply-template  {"messages": [...]} -> {"prompt": the rendered chat, as /v1/chat/completions feeds it}
// Each needs an API key where the server has them; an unknown field is a 400.
#pragma once
#include <string>

#include "server/chat_template.h"
#include "server/http_response.h"

namespace kvs {
class Tokenizer;
}

namespace kvs::server {

HttpResponse tokenize_endpoint(const Tokenizer& tok, const std::string& body);
HttpResponse detokenize_endpoint(const Tokenizer& tok, const std::string& body);
HttpResponse apply_template_endpoint(ChatFamily chat, const std::string& body);

}  // namespace kvs::server
