#include "server/api_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <climits>
#include <regex>
#include <sstream>
#include <random>

#include "kv/prefix_chain.h"
#include "kv/prefix_hash.h"
#include "grammar/gbnf.h"
#include "server/chat_prompt.h"
#include "server/dashboard_page.h"
#include "server/token_endpoints.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"
#include "sched/clock.h"
#include "sched/token_budget.h"

namespace kvs::server {

using nlohmann::json;

namespace {

std::string path_of(const std::string& target) { return target.substr(0, target.find('?')); }

// The kvserve_requests_rejected_total label of an error the server decides.
std::string reject_label(const ApiError& e) {
  if (e.status == 401) return "unauthorized";
  if (e.code == "context_length_exceeded") return "context_length";
  if (e.code == "tenant_quota" || e.code == "shutting_down") return e.code;
  if (e.status == 400) return "invalid";
  return "";
}

// 405 with the Allow header RFC 9110 asks for ("GET", "POST", "GET, HEAD").
HttpResponse method_not_allowed(const std::string& allow) {
  HttpResponse r = error_response(make_error(405, "invalid_request_error", "method_not_allowed", "use " + allow));
  r.headers.emplace_back("Allow", allow);
  return r;
}

}  // namespace

ApiService::ApiService(sched::EngineLoop& loop, const Tokenizer& tok, TenantRegistry& tenants, ApiOptions opts)
    : loop_(loop), tok_(tok), tenants_(tenants), opts_(std::move(opts)) {
  const auto salt = random_secret(6);
  static const char* d = "0123456789abcdef";
  for (uint8_t b : salt) {
    id_salt_ += d[b >> 4];
    id_salt_ += d[b & 15];
  }
  // The same model file (and so the same outputs for a seed) gives the same
  // fingerprint across restarts.
  fingerprint_ = "fp_" + (opts_.model_identity.empty() ? std::string("kvserve") : opts_.model_identity.substr(0, 10));
  if (opts_.dashboard) {
    DashboardOptions d = opts_.dashboard_opts;
    if (d.model_id.empty()) d.model_id = opts_.model_id;
    if (!opts_.plots_dir.empty()) {
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(opts_.plots_dir, ec))
        if (e.path().extension() == ".svg") d.plots.push_back(e.path().filename().string());
      std::sort(d.plots.begin(), d.plots.end());
    }
    dash_ = std::make_unique<ServeDashboard>(loop_, &tenants_, &counters_, d);
    hub_ = std::make_unique<DashboardHub>([this] { return dash_->sample(); }, opts_.dashboard_period_s);
  }
}

void ApiService::set_draining(bool on) {
  draining_ = on;
  if (on && hub_) hub_->stop();
}

Routed ApiService::dashboard(const HttpRequest& req, const std::string& path, std::function<void()> wake) {
  Routed r;
  if (req.method != "GET") {
    r.response = method_not_allowed("GET");
    return r;
  }
  if (path == "/dashboard") {
    // The page holds no data (it reads /dashboard/events with the key), so
    // a browser may load it without an Authorization header.
    r.response.content_type = "text/html; charset=utf-8";
    r.response.body = dashboard_html();
    return r;
  }
  static const std::string kPlots = "/dashboard/plots/";
  if (path.compare(0, kPlots.size(), kPlots) == 0) {
    const std::string name = path.substr(kPlots.size());
    static const std::regex kName("[A-Za-z0-9][A-Za-z0-9._-]*\\.svg");
    const auto& plots = dash_->options().plots;
    if (!std::regex_match(name, kName) || std::find(plots.begin(), plots.end(), name) == plots.end()) {
      r.response = error_response(make_error(404, "not_found_error", "not_found", "no such plot"));
      return r;
    }
    std::ifstream f(std::filesystem::path(opts_.plots_dir) / name, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    r.response.content_type = "image/svg+xml";
    r.response.body = ss.str();
    return r;
  }
  if (tenants_.auth_required()) {
    auto caller = tenants_.authenticate(req.authorization);
    if (!caller) {
      r.response = error_response(unauthorized());
      return r;
    }
    if (!caller->policy.admin) {
      r.response = error_response(make_error(403, "permission_error", "not_admin", "the dashboard needs an admin key"));
      return r;
    }
  }
  if (path == "/dashboard/events") {
    r.stream = hub_->subscribe(std::move(wake));
    return r;
  }
  if (path == "/dashboard/snapshot") {
    r.response.body = hub_->latest();
    if (r.response.body.empty())
      r.response = error_response(make_error(503, "service_unavailable", "loading", "no snapshot yet"));
    return r;
  }
  r.response = error_response(make_error(404, "not_found_error", "not_found", "no route for GET " + path));
  return r;
}

void ApiService::log(const std::string& line) const {
  if (opts_.log) {
    opts_.log(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

HttpResponse ApiService::fail(const ApiError& e, const std::string& tenant_hash) {
  const std::string label = reject_label(e);
  if (!label.empty()) counters_.count_reject(label);
  counters_.count_status(e.status);
  // Codes and the field name only: messages may quote client input.
  log("kvserve: request id=- tenant=" + tenant_hash + " status=" + std::to_string(e.status) +
      " error=" + (e.code.empty() ? e.type : e.code) + " param=" + (e.param.empty() ? "-" : e.param));
  return error_response(e);
}

Routed ApiService::handle(const HttpRequest& req, std::function<void()> wake) {
  const std::string path = path_of(req.target);
  Routed r;
  if (path == "/health") {
    // HEAD: the session sends the head alone.
    if (req.method != "GET" && req.method != "HEAD") {
      r.response = method_not_allowed("GET, HEAD");
      return r;
    }
    if (ready_ && !draining_) {
      // What a router needs to compute the same block hashes: the model
      // identity folded into every scope, the block size, and the key
      // protocol's fingerprint (a router that keys otherwise refuses us
      // rather than missing every prefix silently).
      nlohmann::json h = {{"status", "ok"},
                          {"model", opts_.model_id},
                          {"model_identity", opts_.model_identity},
                          {"block_size", loop_.block_size()},
                          {"prefix_key_protocol", prefix_key_protocol()}};
      h.update(opts_.health_extra);
      r.response = json_response(200, h);
    } else {
      r.response = json_response(503, {{"status", draining_ ? "draining" : "loading"}});
    }
    return r;
  }
  static const std::string kModel = "/v1/models/";
  const bool one_model = path.size() > kModel.size() && path.compare(0, kModel.size(), kModel) == 0;
  const bool get_only = path == "/metrics" || path == "/v1/models" || path == "/models" || one_model;
  if (get_only && req.method != "GET") {
    r.response = method_not_allowed("GET");
    return r;
  }
  if (path == "/metrics") {
    r.response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.response.body = render_metrics(loop_.metrics(), counters_.snapshot(), {opts_.metrics_vllm, opts_.model_id});
    if (opts_.extra_metrics) r.response.body += opts_.extra_metrics();
    return r;
  }
  if (hub_ && (path == "/dashboard" || path.compare(0, 11, "/dashboard/") == 0)) return dashboard(req, path, std::move(wake));
  if (path == "/v1/models" || path == "/models" || one_model) {
    r.response = one_model ? models(req, path.substr(kModel.size())) : models(req);
    return r;
  }
  if (path == "/v1/embeddings" || path == "/embeddings") {
    // Said plainly rather than a bare 404: clients probing for embeddings
    // learn why and where to look.
    r.response = error_response(make_error(
        404, "not_found_error", "embeddings_not_served",
        "kvserve serves generation only: /v1/embeddings (mean-pooled hidden states) is not implemented"));
    return r;
  }
  if (path == "/tokenize" || path == "/detokenize" || path == "/apply-template") {
    r.response = token_tools(req, path);
    return r;
  }
  static const std::string kResponse = "/v1/responses/";
  if (path.size() > kResponse.size() && path.compare(0, kResponse.size(), kResponse) == 0)
    return Routed{stored_response(req, path.substr(kResponse.size())), nullptr, nullptr};
  const bool cmpl = path == "/v1/completions" || path == "/completions";
  const bool chat = path == "/v1/chat/completions" || path == "/chat/completions";
  const bool resp = path == "/v1/responses" || path == "/responses";
  if (cmpl || chat || resp) {
    if (req.method != "POST") {
      r.response = method_not_allowed("POST");
      return r;
    }
    return completions(resp ? Endpoint::Responses : chat ? Endpoint::Chat : Endpoint::Completions, req, std::move(wake));
  }
  static const std::string kAdmin = "/admin/tenants/", kRevoke = "/revoke";
  if (path.size() > kAdmin.size() + kRevoke.size() && path.compare(0, kAdmin.size(), kAdmin) == 0 &&
      path.compare(path.size() - kRevoke.size(), kRevoke.size(), kRevoke) == 0) {
    if (req.method != "POST") {
      r.response = method_not_allowed("POST");
      return r;
    }
    r.response = revoke(req, path.substr(kAdmin.size(), path.size() - kAdmin.size() - kRevoke.size()));
    return r;
  }
  r.response = error_response(make_error(404, "not_found_error", "not_found", "no route for " + req.method + " " + path));
  return r;
}

HttpResponse ApiService::token_tools(const HttpRequest& req, const std::string& path) const {
  if (req.method != "POST") return method_not_allowed("POST");
  if (!tenants_.authenticate(req.authorization)) return error_response(unauthorized());
  if (path == "/tokenize") return tokenize_endpoint(tok_, req.body);
  if (path == "/detokenize") return detokenize_endpoint(tok_, req.body);
  return apply_template_endpoint(opts_.chat, req.body);
}

// As OpenAI's responses.retrieve / responses.delete; another tenant's id is
// as unknown as one never stored.
HttpResponse ApiService::stored_response(const HttpRequest& req, const std::string& id) {
  if (req.method != "GET" && req.method != "DELETE") return method_not_allowed("GET, DELETE");
  auto caller = tenants_.authenticate(req.authorization);
  if (!caller) return error_response(unauthorized());
  const ApiError missing = make_error(404, "invalid_request_error", "response_not_found",
                                      "no response '" + id + "' (expired, never stored, or made with store: false)");
  const double now = sched::steady_now();
  if (req.method == "DELETE") {
    if (!responses_.erase(caller->policy.id, id, now)) return error_response(missing);
    return json_response(200, {{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
  }
  auto obj = responses_.object(caller->policy.id, id, now);
  if (!obj) return error_response(missing);
  return json_response(200, *obj);
}

HttpResponse ApiService::models(const HttpRequest& req, const std::optional<std::string>& id) const {
  if (!tenants_.authenticate(req.authorization)) return error_response(unauthorized());
  json m = {{"id", opts_.model_id}, {"object", "model"}, {"created", opts_.model_created}, {"owned_by", "kvserve"},
            {"max_model_len", opts_.ctx}};
  if (id) {
    if (*id == opts_.model_id) return json_response(200, m);
    return error_response(make_error(404, "invalid_request_error", "model_not_found",
                                     "the model does not exist; this server serves '" + opts_.model_id + "'"));
  }
  return json_response(200, {{"object", "list"}, {"data", json::array({m})}});
}

HttpResponse ApiService::revoke(const HttpRequest& req, const std::string& tenant) {
  auto caller = tenants_.authenticate(req.authorization);
  if (!caller) return error_response(unauthorized());
  if (!caller->policy.admin)
    return error_response(make_error(403, "permission_error", "not_admin", "this key may not administer tenants"));
  std::vector<Scope> retired;
  auto v = tenants_.revoke(tenant, &retired);
  if (!v) return error_response(make_error(404, "not_found_error", "tenant_not_found", "unknown tenant"));
  // The old scopes' cached blocks are freed now (the engine thread does it
  // between two steps; this waits for it).
  int64_t dropped = 0;
  for (const Scope& sc : retired) dropped += loop_.drop_scope(sc);
  log("kvserve: revoke tenant=" + tenant_hash(tenant) + " permission_version=" + std::to_string(*v) +
      " dropped_blocks=" + std::to_string(dropped));
  return json_response(200, {{"tenant", tenant}, {"permission_version", *v}, {"dropped_blocks", dropped}});
}

Routed ApiService::completions(Endpoint ep, const HttpRequest& req, std::function<void()> wake) {
  Routed out;
  if (!ready_) {
    out.response = fail(make_error(503, "service_unavailable", "loading", "the model is still loading"), "-");
    return out;
  }
  if (draining_) {
    out.response = fail(make_error(503, "service_unavailable", "shutting_down", "the server is shutting down"), "-");
    return out;
  }
  auto caller = tenants_.authenticate(req.authorization);
  if (!caller) {
    out.response = fail(unauthorized(), "-");
    return out;
  }
  Prepared pr;
  std::optional<HandoverQuery> hq;
  try {
    pr = prepare(ep, req, *caller);
    hq = handover_query(req.target);
    pr.decode_peer = decode_peer_query(req.target);
    if ((hq || opts_.hand_off_sink) && pr.prompts.size() != 1)
      throw bad_request("a request served by a prefill and a decode worker must have one prompt (it has " +
                            std::to_string(pr.prompts.size()) + "): send one request per prompt",
                        "prompt");
    if ((hq || opts_.hand_off_sink) && pr.p.n != 1)
      throw bad_request("a request served by a prefill and a decode worker must have n = 1 (it has " +
                            std::to_string(pr.p.n) + "): send n requests with different seeds",
                        "n");
  } catch (const ApiError& e) {
    out.response = fail(e, caller->tenant_hash);
    return out;
  }
  // Per-tenant block quota (the key file's quota_blocks) on the worst case
  // of the tenant's in-flight requests: each choice's prompt + completion.
  int64_t reserved = 0;
  if (caller->policy.quota_blocks > 0) {
    if (!tenants_.try_reserve(caller->policy.id, pr.need_blocks)) {
      ApiError e = make_error(429, "rate_limit_error", "tenant_quota",
                              "the tenant's KV block quota is in use by its other requests");
      e.retry_after_s = 1;
      out.response = fail(e, caller->tenant_hash);
      return out;
    }
    reserved = pr.need_blocks;
  }
  return submit(ep, std::move(pr), *caller, reserved, std::move(wake), hq);
}

int ApiService::decode_peer_query(const std::string& target) const {
  static const std::string kKey = "kv_decode_peer=";
  const size_t q = target.find('?');
  if (q == std::string::npos) return 0;
  const size_t at = target.find(kKey, q);
  if (at == std::string::npos) return 0;
  if (!opts_.decode_peer_index)
    throw bad_request("kv_decode_peer is only accepted by a prefill worker (kvserve serve --role prefill)",
                      "kv_decode_peer");
  const std::string v = target.substr(at + kKey.size(), target.find('&', at) - at - kKey.size());
  const int i = opts_.decode_peer_index(v);
  // Only addresses the operator listed: a client cannot make this worker
  // send KV blocks, or open connections, anywhere else.
  if (i < 0)
    throw bad_request("kv_decode_peer is not one of this prefill worker's --decode-peer addresses", "kv_decode_peer");
  return i;
}

// ?kv_handover=HANDLE.TOKEN.DRAWS.SEED, as the router passes on what the
// prefill worker answered.
std::optional<ApiService::HandoverQuery> ApiService::handover_query(const std::string& target) const {
  static const std::string kKey = "kv_handover=";
  const size_t q = target.find('?');
  if (q == std::string::npos) return std::nullopt;
  const size_t at = target.find(kKey, q);
  if (at == std::string::npos) return std::nullopt;
  if (!opts_.accept_handover)
    throw bad_request("kv_handover is only accepted by a decode worker (kvserve serve --role decode)", "kv_handover");
  const std::string v = target.substr(at + kKey.size(), target.find('&', at) - at - kKey.size());
  unsigned long long handle = 0, draws = 0, seed = 0;
  long long token = -1;
  int used = 0;
  if (std::sscanf(v.c_str(), "%llu.%lld.%llu.%llu%n", &handle, &token, &draws, &seed, &used) != 4 ||
      size_t(used) != v.size() || token < 0 || token > INT32_MAX)
    throw bad_request("kv_handover must be HANDLE.TOKEN.DRAWS.SEED (unsigned integers)", "kv_handover");
  HandoverQuery h;
  h.h = sched::Handover{handle, int32_t(token), draws};
  h.seed = seed;
  return h;
}

// Tools need a template that teaches a call format (the reply is parsed in
// it); a forced choice becomes the request's grammar.
void ApiService::prepare_tools(ParsedRequest& p) const {
  const ToolFormat f = opts_.chat.tool_format();
  if (f == ToolFormat::None)
    throw bad_request("'tools': the chat template (" + opts_.chat.description() +
                          ") teaches no tool-call format; serve with --chat-template set to one that does "
                          "(docs/SERVER.md, \"Tool calls\")",
                      "tools");
  if (!p.tools.forced()) return;
  if (p.grammar)
    throw bad_request("'tool_choice' required or named constrains the reply itself; it cannot be combined with "
                      "'response_format' or 'grammar'",
                      "tool_choice");
  try {
    p.grammar = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(forced_tool_gbnf(f, p.tools)));
  } catch (const grammar::GrammarError& e) {
    throw bad_request(std::string("the tool-call grammar does not compile: ") + e.what(), "tools");
  }
}

// previous_response_id names a conversation only its own tenant stored.
ApiService::Prepared ApiService::prepare(Endpoint ep, const HttpRequest& req, const Caller& caller) {
  Prepared pr;
  if (ep == Endpoint::Responses) {
    auto rq = std::make_shared<ResponsesRequest>();
    const std::string prev = previous_response_id(req.body);
    if (!prev.empty()) {
      auto h = responses_.get(caller.policy.id, prev, sched::steady_now());
      if (!h) throw bad_request("previous response '" + prev + "' not found (expired, or never stored)", "previous_response_id");
      pr.history = std::move(*h);
    }
    pr.p = parse_responses(req.body, *rq, pr.history);
    pr.responses = std::move(rq);
  } else {
    pr.p = parse_request(ep, req.body, tok_.n_vocab());
  }
  const ParsedRequest& p = pr.p;
  if (!p.model.empty() && p.model != opts_.model_id &&
      std::find(opts_.model_aliases.begin(), opts_.model_aliases.end(), p.model) == opts_.model_aliases.end())
    throw make_error(404, "invalid_request_error", "model_not_found",
                     "the model '" + p.model + "' does not exist; this server serves '" + opts_.model_id + "'");
  // Tokens. Completions: plain text (special-token texts stay text, as in
  // `kvserve generate`) or ids as given; chat: the rendered template, whose
  // markers are special tokens.
  const bool add_bos = tok_.vocab().add_bos;
  if (ep != Endpoint::Completions) {
    const std::vector<int> ids = tok_.encode(chat_prompt(opts_.chat, p), add_bos, true);
    pr.prompts.emplace_back(ids.begin(), ids.end());
  }
  if (p.tools.active()) prepare_tools(pr.p);
  for (const PromptInput& in : p.prompts) {
    if (in.ids) {
      // Before the echo decodes them: the same rule as the engine's.
      if (std::string e = token_ids_error(*in.ids, tok_.n_vocab(), "'prompt'"); !e.empty()) throw bad_request(e, "prompt");
      pr.prompts.push_back(*in.ids);
    } else {
      const std::vector<int> ids = tok_.encode(in.text, add_bos, false);
      pr.prompts.emplace_back(ids.begin(), ids.end());
    }
    if (p.echo) pr.echo.push_back(in.ids ? tok_.decode(std::vector<int>(in.ids->begin(), in.ids->end())) : in.text);
  }
  const int bs = loop_.block_size();
  for (size_t i = 0; i < pr.prompts.size(); ++i) {
    const std::string which = pr.prompts.size() > 1 ? "prompt[" + std::to_string(i) + "]" : "the prompt";
    const int P = int(pr.prompts[i].size());
    // An empty text prompt still has the BOS token when the model adds one
    // (generation starts from BOS, as OpenAI and vLLM do).
    if (P == 0)
      throw bad_request(which + " has no tokens (an empty prompt needs a model that adds a BOS token)", "prompt");
    if (P >= opts_.ctx) {
      // The prompt alone fills the context: it is at fault, not max_tokens.
      ApiError e = bad_request(which + " has " + std::to_string(P) + " tokens and this model's context holds " +
                                   std::to_string(opts_.ctx) + " (prompt and completion together)",
                               ep == Endpoint::Completions ? "prompt" : ep == Endpoint::Chat ? "messages" : "input");
      e.code = "context_length_exceeded";
      throw e;
    }
    const sched::TokenBudget budget = sched::token_budget(P, p.max_tokens, opts_.ctx, opts_.default_max_tokens, which);
    if (!budget.ok()) {
      ApiError e = bad_request(budget.error, "max_tokens");
      if (budget.context_length) e.code = "context_length_exceeded";
      throw e;
    }
    const int mt = budget.max_tokens;
    // The codec checks an explicit max_tokens; this, the one the context left.
    if (p.min_tokens > mt)
      throw bad_request("'min_tokens' (" + std::to_string(p.min_tokens) + ") exceeds the " + std::to_string(mt) +
                            " tokens " + which + " may generate",
                        "min_tokens");
    pr.max_tokens.push_back(mt);
    pr.prompt_tokens += P;
    pr.need_blocks += int64_t(p.n) * ((int64_t(P) + mt + bs - 1) / bs);
  }
  return pr;
}

Routed ApiService::submit(Endpoint ep, Prepared&& pr, const Caller& caller, int64_t reserved,
                          std::function<void()> wake, const std::optional<HandoverQuery>& hq) {
  Routed out;
  const ParsedRequest& p = pr.p;
  // Service class: the key's class is the ceiling; a request may ask for
  // batch, never for better than its key allows.
  sched::SloClass slo = caller.policy.slo;
  if (p.slo && *p.slo == sched::SloClass::Batch) slo = sched::SloClass::Batch;
  // One scope for all prompts: their common prefixes share blocks.
  const Scope scope = tenants_.scope_for(caller.policy.id, opts_.model_identity, sched::steady_now());
  const int bs = loop_.block_size();
  std::string prefix_hash = "-";
  if (int(pr.prompts[0].size()) >= bs) prefix_hash = to_hex(block_key(nullptr, pr.prompts[0].data(), bs, scope)).substr(0, 16);

  Exchange::Setup s;
  s.loop = &loop_;
  s.tok = &tok_;
  s.tenants = &tenants_;
  s.counters = &counters_;
  s.endpoint = ep;
  s.hand_off = bool(opts_.hand_off_sink);
  s.stream = p.stream && !s.hand_off;  // the prefill worker's answer is the hand-over
  s.include_usage = p.include_usage;
  s.continuous_usage = p.continuous_usage;
  s.logprobs = p.logprobs;
  s.n = p.n;
  s.prompts = int(pr.prompts.size());
  s.echo = std::move(pr.echo);
  s.prompt_tokens = pr.prompt_tokens;
  char idbuf[40];
  std::snprintf(idbuf, sizeof idbuf, "%s%s%06llx",
                ep == Endpoint::Responses ? "resp_" : ep == Endpoint::Chat ? "chatcmpl-" : "cmpl-", id_salt_.c_str(),
                static_cast<unsigned long long>(next_id_++));
  s.meta.id = idbuf;
  s.meta.created = int64_t(std::time(nullptr));
  s.meta.model = opts_.model_id;
  s.meta.system_fingerprint = fingerprint_;
  s.tenant = caller.policy.id;
  s.quota_blocks = reserved;
  s.log_prefix = std::string("id=") + idbuf + " tenant=" + caller.tenant_hash + " prefix=" + prefix_hash +
                 " class=" + sched::to_string(slo) + (s.prompts > 1 ? " prompts=" + std::to_string(s.prompts) : "") +
                 (p.stream ? " stream" : "") + (hq ? " handover=" + std::to_string(hq->h.handle) : "");
  s.queue_events = opts_.stream_queue_events;
  if (pr.responses) {
    s.responses = pr.responses;
    if (pr.responses->store) {
      // The conversation this response continues, its input, its output.
      Conversation conv = pr.history;
      for (const auto& m : pr.responses->input) conv.push_back(m);
      const double ttl = caller.policy.retention_s > 0 ? caller.policy.retention_s : 3600.0;
      s.on_done = [this, conv = std::move(conv), tenant = caller.policy.id, id = std::string(idbuf), ttl](
                      const json& obj, const std::string& text, const std::vector<ToolCall>& calls) mutable {
        conv.push_back(assistant_turn(text, calls));
        responses_.put(tenant, id, std::move(conv), obj, sched::steady_now(), ttl);
      };
    }
  }
  s.log = opts_.log;
  if (p.tools.active()) s.tool_format = opts_.chat.tool_format();
  const uint64_t seed = hq ? hq->seed : p.seeded ? p.sampling.seed : std::random_device{}();
  s.seed = seed;
  if (hq && opts_.await_handover) s.handover_hold = opts_.await_handover(hq->h.handle);
  auto ex = std::make_shared<Exchange>(std::move(s));
  ex->queue()->set_wake(std::move(wake));

  for (size_t i = 0; i < pr.prompts.size(); ++i) {
    sched::Request r;
    r.prompt = std::move(pr.prompts[i]);
    r.sampling = p.sampling;
    r.sampling.seed = seed;
    r.max_tokens = pr.max_tokens[i];
    r.stop = p.stop;
    r.ignore_eos = p.ignore_eos;
    r.min_tokens = p.min_tokens;
    r.stop_token_ids = p.stop_token_ids;
    r.n = p.n;
    r.slo = slo;
    r.tenant = caller.tenant_hash;  // the loop's quota key and log field: a hash, never the id
    r.scope = scope;
    r.retention_s = caller.policy.retention_s;
    r.logprobs = p.logprobs;
    r.prompt_logprobs = p.echo && p.logprobs;
    r.grammar = p.grammar;
    r.special_text = p.tools.active();  // the parser reads the markers, control tokens included
    r.top_logprobs = p.top_logprobs;
    r.sink = ex->sink_for(int(i));
    if (opts_.hand_off_sink) {
      r.hand_off = true;
      r.sink = opts_.hand_off_sink(std::move(r.sink), scope, pr.decode_peer);
    }
    if (hq) r.handover = hq->h;
    const sched::SubmitResult res = loop_.submit(std::move(r));
    if (!res.accepted) {
      // The exchange's destructor cancels the prompts already submitted,
      // gives the quota back and logs the status.
      const ApiError e = reject_error(res.reason, res.message, res.retry_after_s, res.param);
      ex->set_final_status(e.status);
      out.response = error_response(e);
      return out;
    }
    ex->set_request_id(int(i), res.id);
  }
  out.exchange = std::move(ex);
  return out;
}

}  // namespace kvs::server
