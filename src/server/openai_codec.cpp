#include "server/openai_codec.h"

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "server/request_fields.h"
#include "tokenizer/vocab.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>

namespace kvs::server {

using nlohmann::json;
using sched::FinishReason;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return dump(json{{"error", err}});
}

ApiError bad_request(const std::string& message, const std::string& param) {
  ApiError e;
  e.status = 400;
  e.message = message;
  e.param = param;
  return e;
}

namespace {

// Field readers: absent or null -> nullopt; wrong type -> 400 naming it.
const json* field(const json& o, const char* k) {
  auto it = o.find(k);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> get_number(const json& o, const char* k, double lo, double hi) {
  const json* v = field(o, k);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(std::string("'") + k + "' must be a number", k);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw bad_request(std::string("'") + k + "' must be between " + json(lo).dump() + " and " + json(hi).dump(), k);
  return d;
}

std::optional<int64_t> get_int(const json& o, const char* k, int64_t lo, int64_t hi) {
  const json* v = field(o, k);
  if (!v) return std::nullopt;
  // 3.0 is accepted as 3 (some clients send floats); 3.5 is not.
  if (!v->is_number() || (v->is_number_float() && std::floor(v->get<double>()) != v->get<double>()))
    throw bad_request(std::string("'") + k + "' must be an integer", k);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw bad_request(std::string("'") + k + "' is out of range", k);
  const double d = v->get<double>();
  if (d < double(lo) || d > double(hi))
    throw bad_request(std::string("'") + k + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi), k);
  return v->is_number_float() ? int64_t(d) : v->get<int64_t>();
}

std::optional<bool> get_bool(const json& o, const char* k) {
  const json* v = field(o, k);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(std::string("'") + k + "' must be true or false", k);
  return v->get<bool>();
}

std::string message_content(const json& c, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {  // [{"type": "text", "text": "..."}, ...]
    std::string s;
    for (const auto& part : c) {
      if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
          !part["text"].is_string())
        throw bad_request(where + ": only text parts ({\"type\": \"text\", \"text\": ...}) are supported", where);
      if (&part != &c.front()) s += '\n';  // one line per part, as the chat template gets them
      s += part["text"].get<std::string>();
    }
    return s;
  }
  throw bad_request(where + " must be a string or an array of text parts", where);
}

// "priority": vLLM's integer (lower runs first; <= 0 interactive, > 0
// batch). "slo_class": the class by name. slo_class wins when both are given.
std::optional<sched::SloClass> parse_priority(const json& o) {
  if (const json* v = field(o, "slo_class")) {
    std::optional<sched::SloClass> c;
    if (v->is_string()) c = sched::parse_slo_class(v->get<std::string>());
    if (!c) throw bad_request("'slo_class' must be \"interactive\" or \"batch\"", "slo_class");
    return c;
  }
  const json* v = field(o, "priority");
  if (!v) return std::nullopt;
  if (!v->is_number())
    throw bad_request("'priority' must be an integer (vLLM style: <= 0 interactive, > 0 batch); "
                      "use 'slo_class' for \"interactive\" or \"batch\"",
                      "priority");
  const auto p = get_int(o, "priority", -1000000, 1000000);
  return *p <= 0 ? sched::SloClass::Interactive : sched::SloClass::Batch;
}

std::vector<int32_t> token_ids(const json& a, const std::string& where, const char* param = "prompt") {
  std::vector<int32_t> ids;
  for (const auto& t : a) {
    const bool ok = t.is_number_unsigned() ? t.get<uint64_t>() <= uint64_t(INT32_MAX)
                    : t.is_number_integer() ? t.get<int64_t>() >= 0 && t.get<int64_t>() <= INT32_MAX
                                            : false;
    if (!ok)
      throw bad_request("'" + where + "' token ids must be non-negative integers", param);
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return ids;
}

// OpenAI's shape: {"<token id>": bias in [-100, 100], ...} (at most 300).
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& j) {
  std::vector<std::pair<int32_t, float>> out;
  const json* b = field(j, "logit_bias");
  if (!b) return out;
  if (!b->is_object()) throw bad_request("'logit_bias' must be an object of token id -> bias", "logit_bias");
  if (b->size() > 300) throw bad_request("'logit_bias' has more than 300 entries", "logit_bias");
  for (const auto& [k, v] : b->items()) {
    char* end = nullptr;
    const long long id = std::strtoll(k.c_str(), &end, 10);
    if (k.empty() || *end != 0 || id < 0 || id > INT32_MAX)
      throw bad_request("'logit_bias' keys must be token ids (\"123\"), got \"" + k.substr(0, 32) + "\"", "logit_bias");
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 || v.get<double>() > 100)
      throw bad_request("'logit_bias' values must be numbers between -100 and 100", "logit_bias");
    out.push_back({int32_t(id), float(v.get<double>())});
  }
  return out;
}

// "prompt": a string, an array of strings, an array of token ids, or an
// array of token-id arrays.
std::vector<PromptInput> parse_prompts(const json& p) {
  static const char* kShapes =
      "'prompt' must be a string, an array of strings, an array of token ids or an array of token-id arrays";
  std::vector<PromptInput> out;
  if (p.is_string()) {
    out.push_back({p.get<std::string>(), std::nullopt});
    return out;
  }
  if (!p.is_array()) throw bad_request(kShapes, "prompt");
  if (p.empty()) throw bad_request("'prompt' must not be an empty array", "prompt");
  if (p[0].is_number()) {
    out.push_back({"", token_ids(p, "prompt")});
    return out;
  }
  if (p.size() > size_t(kMaxPrompts))
    throw bad_request("'prompt' has more than " + std::to_string(kMaxPrompts) + " prompts", "prompt");
  for (size_t i = 0; i < p.size(); ++i) {
    const json& x = p[i];
    if (x.is_string() && p[0].is_string()) {
      out.push_back({x.get<std::string>(), std::nullopt});
    } else if (x.is_array() && p[0].is_array()) {
      out.push_back({"", token_ids(x, "prompt[" + std::to_string(i) + "]")});
    } else {
      throw bad_request(std::string(kShapes) + " (not a mix)", "prompt");
    }
  }
  return out;
}

std::vector<ChatMessage> parse_messages(const json& j) {
  const json* m = field(j, "messages");
  if (!m || !m->is_array() || m->empty()) throw bad_request("'messages' must be a non-empty array", "messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m->size(); ++i) {
    const json& x = (*m)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!x.is_object()) throw bad_request(at + " must be an object with a string 'role'", at);
    if (!x.contains("role") || !x["role"].is_string())
      throw bad_request(at + " needs a string 'role': system, developer, user, assistant or tool", at + ".role");
    ChatMessage cm;
    cm.role = x["role"].get<std::string>();
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "developer" &&
        cm.role != "tool")
      throw bad_request(at + ".role must be system, developer, user, assistant or tool", at + ".role");
    if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for the system role
    // Only an assistant turn may leave its content out (one that made tool
    // calls); what a template renders for a missing one differs by template.
    const bool has_content = x.contains("content") && !x["content"].is_null();
    const std::string where = "messages[" + std::to_string(i) + "].content";
    if (!has_content && cm.role != "assistant")
      throw bad_request(where + " is required for a " + x["role"].get<std::string>() + " message", where);
    cm.content = message_content(has_content ? x["content"] : json(nullptr), i);
    out.push_back(std::move(cm));
  }
  return out;
}

// The messages again, in the client's key order (tojson shows it), with the
// role parse_messages settled on.
nlohmann::ordered_json ordered_messages(const nlohmann::ordered_json& body, const std::vector<ChatMessage>& checked) {
  nlohmann::ordered_json m = body["messages"];
  for (size_t i = 0; i < m.size() && i < checked.size(); ++i) m[i]["role"] = checked[i].role;
  return m;
}

// Variables for the chat template (vLLM's and llama.cpp's
// chat_template_kwargs), except those the server itself sets.
nlohmann::ordered_json parse_template_kwargs(const nlohmann::ordered_json& j) {
  auto it = j.find("chat_template_kwargs");
  if (it == j.end() || it->is_null()) return nlohmann::ordered_json::object();
  if (!it->is_object()) throw bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
  for (const char* k : {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"})
    if (it->contains(k))
      throw bad_request(std::string("'chat_template_kwargs' may not set '") + k + "': the server sets it",
                        "chat_template_kwargs");
  return *it;
}

std::vector<std::string> parse_stop(const json& j) {
  std::vector<std::string> stop;
  const json* s = field(j, "stop");
  if (!s) return stop;
  if (s->is_string()) {
    stop.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    for (const auto& x : *s) {
      if (!x.is_string()) throw bad_request("'stop' must be a string or an array of strings", "stop");
      stop.push_back(x.get<std::string>());
    }
  } else {
    throw bad_request("'stop' must be a string or an array of strings", "stop");
  }
  if (int(stop.size()) > kMaxStops) throw bad_request("'stop' has more than 16 strings", "stop");
  for (const auto& x : stop)
    if (x.empty() || x.size() > kMaxStopBytes) throw bad_request("each 'stop' string must be 1..256 bytes long", "stop");
  return stop;
}

// A 400 naming `where`.key for a key of object `o` not in `allowed`:
// nested objects are checked as strictly as the body's top level.
void check_keys(const json& o, const std::string& where, std::initializer_list<const char*> allowed) {
  for (const auto& [k, v] : o.items())
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }))
      throw bad_request("unknown field '" + where + "." + k + "'", where + "." + k);
}

// response_format / grammar to a compiled grammar (null: free text). The
// schema is read from the body again in order: properties must come out in
// the order the client listed them.
std::shared_ptr<const grammar::Grammar> parse_constraint(const json& j, const std::string& body) {
  const json* rf = field(j, "response_format");
  const json* g = field(j, "grammar");
  if (rf && g) throw bad_request("give 'response_format' or 'grammar', not both", "grammar");
  try {
    if (g) {
      if (!g->is_string()) throw bad_request("'grammar' must be a GBNF string", "grammar");
      return std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(g->get<std::string>()));
    }
    if (!rf) return nullptr;
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      throw bad_request("'response_format' must be an object with a 'type'", "response_format");
    check_keys(*rf, "response_format", {"type", "json_schema"});
    const std::string type = (*rf)["type"];
    if (type != "json_schema" && field(*rf, "json_schema"))
      throw bad_request("'response_format.json_schema' goes with type json_schema", "response_format.json_schema");
    if (type == "text") return nullptr;
    if (type == "json_object")
      return std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(grammar::json_object_gbnf()));
    if (type != "json_schema")
      throw bad_request("'response_format.type' must be text, json_object or json_schema", "response_format");
    const nlohmann::ordered_json o = nlohmann::ordered_json::parse(body);
    const auto& js = o["response_format"]["json_schema"];
    if (!js.is_object() || !js.contains("schema"))
      throw bad_request("'response_format.json_schema' must be an object with a 'schema'", "response_format");
    check_keys((*rf)["json_schema"], "response_format.json_schema", {"name", "description", "schema", "strict"});
    if (js.contains("strict") && !js["strict"].is_boolean() && !js["strict"].is_null())
      throw bad_request("'response_format.json_schema.strict' must be true or false", "response_format");
    return std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(grammar::json_schema_gbnf(js["schema"])));
  } catch (const grammar::GrammarError& e) {
    throw bad_request(e.what(), g ? "grammar" : "response_format");
  }
}

// Token ids the request names besides its prompt, against the vocabulary.
void check_vocab(const ParsedRequest& r, int64_t n_vocab) {
  for (const auto& [id, bias] : r.sampling.logit_bias)
    if (!token_in_vocab(id, n_vocab))
      throw bad_request("'logit_bias' token id " + std::to_string(id) + " is outside the vocabulary of " +
                            std::to_string(n_vocab) + " tokens",
                        "logit_bias");
  if (std::string e = token_ids_error(r.stop_token_ids, n_vocab, "'stop_token_ids':"); !e.empty())
    throw bad_request(e, "stop_token_ids");
}

// Sampling: OpenAI's defaults (temperature 1, no top-k/top-p/min-p cut),
// vLLM's penalties, min_tokens and stop_token_ids, and the seed.
void parse_sampling(const json& j, ParsedRequest& r, int64_t n_vocab) {
  r.sampling.temperature = float(get_number(j, "temperature", 0, 2).value_or(1.0));
  const double top_p = get_number(j, "top_p", 0, 1).value_or(1.0);
  if (top_p <= 0) throw bad_request("'top_p' must be greater than 0", "top_p");
  // A top_p below the smallest float keeps the top token, as the value means.
  r.sampling.top_p = std::max(float(top_p), std::numeric_limits<float>::denorm_min());
  r.sampling.top_k = int(get_int(j, "top_k", -1, 1 << 20).value_or(0));
  if (r.sampling.top_k < 0) r.sampling.top_k = 0;  // -1 (vLLM) = off
  r.sampling.min_p = float(get_number(j, "min_p", 0, 1).value_or(0.0));
  r.sampling.repeat_penalty = float(get_number(j, "repetition_penalty", 0.01, 10).value_or(1.0));
  r.sampling.presence_penalty = float(get_number(j, "presence_penalty", -2, 2).value_or(0.0));
  r.sampling.frequency_penalty = float(get_number(j, "frequency_penalty", -2, 2).value_or(0.0));
  r.sampling.logit_bias = parse_logit_bias(j);
  r.min_tokens = int(get_int(j, "min_tokens", 0, 1 << 24).value_or(0));
  if (const json* st = field(j, "stop_token_ids")) {
    if (!st->is_array()) throw bad_request("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    r.stop_token_ids = token_ids(*st, "stop_token_ids", "stop_token_ids");
    if (r.stop_token_ids.size() > 64) throw bad_request("'stop_token_ids' has more than 64 ids", "stop_token_ids");
  }
  if (n_vocab > 0) check_vocab(r, n_vocab);
  // -1 is llama-server's "random": the server draws one, as without a seed.
  // Any other integer, negative too, is a fixed seed (vLLM takes any int64).
  auto s = get_int(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  if (s && *s != -1) {
    r.sampling.seed = uint64_t(*s);
    r.seeded = true;
  }
}

// stream_options: OpenAI's include_usage and vLLM's continuous_usage_stats
// (usage in every chunk, which vLLM gives only with include_usage). Only
// with "stream": true, as OpenAI answers.
void parse_stream_options(const json& j, ParsedRequest& r) {
  const json* so = field(j, "stream_options");
  if (!so) return;
  if (!so->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
  if (!r.stream) throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
  check_keys(*so, "stream_options", {"include_usage", "continuous_usage_stats"});
  auto flag = [&](const char* k) {
    const json* v = field(*so, k);
    const std::string path = std::string("stream_options.") + k;
    if (v && !v->is_boolean()) throw bad_request("'" + path + "' must be true or false", path);
    return v && v->get<bool>();
  };
  r.include_usage = flag("include_usage");
  r.continuous_usage = flag("continuous_usage_stats");
  if (r.continuous_usage && !r.include_usage)
    throw bad_request("'stream_options.continuous_usage_stats' needs 'stream_options.include_usage': true",
                      "stream_options.continuous_usage_stats");
}

// nlohmann's own text quotes the bytes it last read (prompt text): the
// client gets the offset instead.
ApiError json_syntax_error(const json::exception& e, const std::string& body) {
  if (body.empty()) return bad_request("the request body is empty (expected a JSON object)");
  if (const auto* pe = dynamic_cast<const json::parse_error*>(&e)) {
    // The parser counts the end of the input as one byte past it.
    if (pe->byte > body.size())
      return bad_request("the request body is not valid JSON (unexpected end of the body after " +
                         std::to_string(body.size()) + " bytes)");
    return bad_request("the request body is not valid JSON (error at byte " + std::to_string(pe->byte) + " of " +
                       std::to_string(body.size()) + ")");
  }
  return bad_request("the request body is not valid JSON");
}

}  // namespace

ParsedRequest parse_request(Endpoint ep, const std::string& body, int64_t n_vocab) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw json_syntax_error(e, body);
  }
  if (!j.is_object()) throw bad_request("request body must be a JSON object");
  check_fields(ep, j);
  ParsedRequest r;
  r.endpoint = ep;
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) throw bad_request("'model' must be a string", "model");
    r.model = m->get<std::string>();
  }
  if (const json* u = field(j, "user"); u && !u->is_string()) throw bad_request("'user' must be a string", "user");
  if (ep == Endpoint::Completions) {
    const json* p = field(j, "prompt");
    if (!p) throw bad_request("'prompt' is required", "prompt");
    r.prompts = parse_prompts(*p);
  } else {
    r.messages = parse_messages(j);
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body);
    r.chat_messages = ordered_messages(ordered, r.messages);
    r.chat_template_kwargs = parse_template_kwargs(ordered);
    r.tools = parse_tool_request(ordered);
  }
  parse_sampling(j, r, n_vocab);
  // chat: max_completion_tokens is the newer name; max_tokens still works.
  const char* mt_key = (ep == Endpoint::Chat && field(j, "max_completion_tokens")) ? "max_completion_tokens" : "max_tokens";
  if (auto mt = get_int(j, mt_key, 1, 1 << 24)) r.max_tokens = int(*mt);
  if (r.max_tokens && r.min_tokens > *r.max_tokens)
    throw bad_request("'min_tokens' (" + std::to_string(r.min_tokens) + ") exceeds '" + mt_key + "' (" +
                          std::to_string(*r.max_tokens) + ")",
                      "min_tokens");
  r.stop = parse_stop(j);
  r.n = int(get_int(j, "n", 1, kMaxChoices).value_or(1));
  if (r.prompts.size() * size_t(r.n) > size_t(kMaxTotalChoices))
    throw bad_request("prompts x n must be at most " + std::to_string(kMaxTotalChoices), "n");
  r.stream = get_bool(j, "stream").value_or(false);
  parse_stream_options(j, r);
  if (ep == Endpoint::Completions) {
    // Legacy completions: "logprobs": k = the sampled token plus k alternatives.
    if (auto lp = get_int(j, "logprobs", 0, kMaxTopLogprobs)) {
      r.logprobs = true;
      r.top_logprobs = int(*lp);
    }
    // With logprobs, the prompt's own logprobs too (Request::prompt_logprobs).
    r.echo = get_bool(j, "echo").value_or(false);
  } else {
    r.logprobs = get_bool(j, "logprobs").value_or(false);
    if (auto tl = get_int(j, "top_logprobs", 0, kMaxTopLogprobs)) {
      if (!r.logprobs && *tl > 0) throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      r.top_logprobs = int(*tl);
    }
  }
  r.ignore_eos = get_bool(j, "ignore_eos").value_or(false);
  r.slo = parse_priority(j);
  r.grammar = parse_constraint(j, body);
  return r;
}

const char* finish_reason_name(FinishReason f) {
  switch (f) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "abort";
    case FinishReason::Rejected: return "abort";
    case FinishReason::Error: return "error";
    case FinishReason::None: break;
    case FinishReason::HandedOff: break;  // answered with the hand-over, never as a choice
  }
  return "stop";
}

json usage_json(const sched::Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}
json chat_logprob_entry(const sched::TokenLogprob& lp, const std::vector<sched::TokenLogprob>& top,
                        const TokenText& tt) {
  const std::string s = tt(lp.token);
  json e = {{"token", s}, {"logprob", lp.logprob}, {"bytes", bytes_of(s)}};
  json alts = json::array();
  for (const auto& a : top) {
    const std::string as = tt(a.token);
    alts.push_back({{"token", as}, {"logprob", a.logprob}, {"bytes", bytes_of(as)}});
  }
  e["top_logprobs"] = alts;
  return e;
}

// Legacy completions' alternatives: the k best and the token itself (k + 1
// at most), as OpenAI and vLLM list them, keyed by the token's text as
// `tokens` spells it.
json legacy_alternatives(int32_t id, const std::string& text, float logprob,
                         const std::vector<sched::TokenLogprob>& top, const TokenText& tt) {
  json alts = json::object();
  for (const auto& a : top) alts[a.token == id ? text : tt(a.token)] = a.logprob;
  alts[text] = logprob;
  return alts;
}

// Legacy completions: parallel arrays.
void add_legacy_logprob(json& lp, const sched::TokenLogprob& t, const std::vector<sched::TokenLogprob>& top,
                        const TokenText& tt, int64_t offset) {
  lp["tokens"].push_back(tt(t.token));
  lp["token_logprobs"].push_back(t.logprob);
  lp["top_logprobs"].push_back(legacy_alternatives(t.token, tt(t.token), t.logprob, top, tt));
  lp["text_offset"].push_back(offset);
}

// Echo with logprobs: the prompt's tokens lead the arrays, the first one
// with null logprob and alternatives (it is given, not predicted). Their
// texts and offsets follow the echoed text: a SentencePiece prompt's pieces
// spell it with a leading space that the text does not have, so that much
// is cut from the front of the first pieces (the tokens then spell the text
// exactly, and text[text_offset[i]:] starts with tokens[i]). The generated
// tokens start after the echo, whatever the pieces spell.
void add_prompt_logprobs(json& lp, const std::vector<sched::PromptLogprob>& prompt, const TokenText& tt,
                         std::string_view echo, int64_t& off) {
  std::vector<std::string> pieces;
  std::string spelled;
  for (const sched::PromptLogprob& p : prompt) spelled += pieces.emplace_back(tt(p.token));
  const bool aligned =
      spelled.size() >= echo.size() && std::string_view(spelled).substr(spelled.size() - echo.size()) == echo;
  size_t cut = aligned ? spelled.size() - echo.size() : 0;
  const int64_t end = off + int64_t(echo.size());
  for (size_t i = 0; i < prompt.size(); ++i) {
    const sched::PromptLogprob& p = prompt[i];
    const size_t drop = std::min(cut, pieces[i].size());
    cut -= drop;
    const std::string spelled_as = pieces[i].substr(drop);
    lp["tokens"].push_back(spelled_as);
    lp["token_logprobs"].push_back(p.logprob ? json(*p.logprob) : json(nullptr));
    lp["top_logprobs"].push_back(p.logprob ? legacy_alternatives(p.token, spelled_as, *p.logprob, p.top, tt)
                                           : json(nullptr));
    lp["text_offset"].push_back(std::min(off, end));  // never past the echo (pieces it does not spell)
    off += int64_t(pieces[i].size() - drop);
  }
  off = end;
}

// The fields every response object and chunk starts with.
json response_head(const ResponseMeta& meta, const char* object) {
  json out;
  out["id"] = meta.id;
  out["object"] = object;
  out["created"] = meta.created;
  out["model"] = meta.model;
  if (!meta.system_fingerprint.empty()) out["system_fingerprint"] = meta.system_fingerprint;
  return out;
}

// Chat logprobs carry a "refusal" list beside "content"; this server never refuses.
// OpenAI's tool_calls array; in a stream each entry also carries its index.
json tool_calls_json(const std::vector<ToolCall>& calls, int first_index, bool indexed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c;
    if (indexed) c["index"] = first_index + int(i);
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

json chat_logprobs(json content) { return json{{"content", std::move(content)}, {"refusal", nullptr}}; }

json empty_legacy_logprobs() {
  return json{{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
}

}  // namespace

json completion_response(Endpoint ep, const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                         const sched::Usage& usage, bool logprobs, const TokenText& tt) {
  json out = response_head(meta, ep == Endpoint::Chat ? "chat.completion" : "text_completion");
  json arr = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json ch;
    ch["index"] = i;
    json lp = nullptr;
    if (logprobs) {
      if (ep == Endpoint::Chat) {
        json content = json::array();
        for (size_t k = 0; k < c.logprobs.size(); ++k)
          content.push_back(chat_logprob_entry(c.logprobs[k], c.top_logprobs.at(k), tt));
        lp = chat_logprobs(std::move(content));
      } else {
        lp = empty_legacy_logprobs();
        int64_t off = 0;
        add_prompt_logprobs(lp, c.prompt_logprobs, tt, std::string_view(c.text).substr(0, c.echo_bytes), off);
        for (size_t k = 0; k < c.logprobs.size(); ++k) {
          add_legacy_logprob(lp, c.logprobs[k], c.top_logprobs.at(k), tt, off);
          off += int64_t(tt(c.logprobs[k].token).size());
        }
      }
    }
    const bool called = !c.tool_calls.empty();
    if (ep == Endpoint::Chat) {
      // With calls and no other text, content is null (as OpenAI sends it).
      const bool blank = c.text.find_first_not_of(" \t\r\n") == std::string::npos;
      ch["message"] = {{"role", "assistant"}, {"content", called && blank ? json(nullptr) : json(c.text)},
                       {"refusal", nullptr}};
      if (!c.reasoning.empty()) ch["message"]["reasoning_content"] = c.reasoning;
      if (called) ch["message"]["tool_calls"] = tool_calls_json(c.tool_calls, 0, false);
    } else {
      ch["text"] = c.text;
    }
    ch["logprobs"] = lp;
    ch["finish_reason"] = called && c.finish == FinishReason::Stop ? "tool_calls" : finish_reason_name(c.finish);
    arr.push_back(std::move(ch));
  }
  out["choices"] = std::move(arr);
  out["usage"] = usage_json(usage);
  return out;
}

json stream_chunk(Endpoint ep, const ResponseMeta& meta, const sched::TokenEvent& e, bool first,
                  const std::vector<LogprobEntry>* logprobs, const TokenText& tt, const ChatExtras* x,
                  TextOffsets* offsets) {
  const bool final = e.finish != FinishReason::None;
  const bool has_lp = logprobs && (!logprobs->empty() || !e.prompt_logprobs.empty());
  const bool has_x = x && (!x->parsed.calls.empty() || !x->parsed.reasoning.empty());
  if (e.text.empty() && !final && !has_lp && !has_x && !(first && ep == Endpoint::Chat)) return nullptr;
  json out = response_head(meta, ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
  json ch;
  ch["index"] = e.choice;
  json lp = nullptr;
  if (has_lp) {
    if (ep == Endpoint::Chat) {
      json content = json::array();
      for (const LogprobEntry& t : *logprobs) content.push_back(chat_logprob_entry(t.token, t.top, tt));
      lp = chat_logprobs(std::move(content));
    } else {
      lp = empty_legacy_logprobs();
      TextOffsets here;
      TextOffsets& o = offsets ? *offsets : here;
      if (!e.prompt_logprobs.empty() || !o.echo.empty()) {
        add_prompt_logprobs(lp, e.prompt_logprobs, tt, o.echo, o.next);
        o.echo.clear();  // it led this chunk's text only
      }
      for (const LogprobEntry& t : *logprobs) {
        add_legacy_logprob(lp, t.token, t.top, tt, o.next);
        o.next += int64_t(tt(t.token.token).size());
      }
    }
  }
  if (ep == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!e.text.empty() || first) delta["content"] = e.text;
    if (first) delta["refusal"] = nullptr;
    if (x && !x->parsed.reasoning.empty()) delta["reasoning_content"] = x->parsed.reasoning;
    if (x && !x->parsed.calls.empty()) delta["tool_calls"] = tool_calls_json(x->parsed.calls, x->first_call, true);
    ch["delta"] = std::move(delta);
  } else {
    ch["text"] = e.text;
  }
  ch["logprobs"] = lp;
  ch["finish_reason"] = final ? json(x && x->tool_finish && e.finish == FinishReason::Stop ? "tool_calls"
                                                                                          : finish_reason_name(e.finish))
                              : json(nullptr);
  out["choices"] = json::array({std::move(ch)});
  return out;
}

json usage_chunk(Endpoint ep, const ResponseMeta& meta, const sched::Usage& u) {
  json out = response_head(meta, ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage_json(u);
  return out;
}

}  // namespace kvs::server
