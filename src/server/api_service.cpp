#include "server/api_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include "kv/prefix_hash.h"
#include "tokenizer/tokenizer.h"
#include "sched/clock.h"

namespace kvs::server {

using nlohmann::json;

namespace {

HttpResponse json_response(int status, const json& j) {
  HttpResponse r;
  r.status = status;
  r.body = dump(j);
  return r;
}

ApiError make_error(int status, const std::string& type, const std::string& code, const std::string& msg) {
  ApiError e;
  e.status = status;
  e.type = type;
  e.code = code;
  e.message = msg;
  return e;
}

std::string path_of(const std::string& target) { return target.substr(0, target.find('?')); }

}  // namespace

ApiService::ApiService(sched::EngineLoop& loop, const Tokenizer& tok, TenantRegistry& tenants, ApiOptions opts)
    : loop_(loop), tok_(tok), tenants_(tenants), opts_(std::move(opts)) {
  const auto salt = random_secret(6);
  static const char* d = "0123456789abcdef";
  for (uint8_t b : salt) {
    id_salt_ += d[b >> 4];
    id_salt_ += d[b & 15];
  }
}

HttpResponse ApiService::fail(const ApiError& e, const std::string& reject_label) {
  if (!reject_label.empty()) counters_.count_reject(reject_label);
  counters_.count_status(e.status);
  return error_response(e);
}

Routed ApiService::handle(const HttpRequest& req, std::function<void()> wake) {
  const std::string path = path_of(req.target);
  Routed r;
  if (path == "/health") {
    if (ready_ && !draining_) {
      r.response = json_response(200, {{"status", "ok"}});
    } else {
      r.response = json_response(503, {{"status", draining_ ? "draining" : "loading"}});
    }
    return r;
  }
  if (path == "/metrics" && req.method == "GET") {
    r.response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.response.body = render_metrics(loop_.metrics(), counters_.snapshot());
    return r;
  }
  if ((path == "/v1/models" || path == "/models") && req.method == "GET") {
    r.response = models();
    return r;
  }
  const bool cmpl = path == "/v1/completions" || path == "/completions";
  const bool chat = path == "/v1/chat/completions" || path == "/chat/completions";
  if (cmpl || chat) {
    if (req.method != "POST") {
      r.response = error_response(make_error(405, "invalid_request_error", "method_not_allowed", "use POST"));
      return r;
    }
    return completions(chat ? Endpoint::Chat : Endpoint::Completions, req, std::move(wake));
  }
  static const std::string kAdmin = "/admin/tenants/", kRevoke = "/revoke";
  if (path.size() > kAdmin.size() + kRevoke.size() && path.compare(0, kAdmin.size(), kAdmin) == 0 &&
      path.compare(path.size() - kRevoke.size(), kRevoke.size(), kRevoke) == 0) {
    if (req.method != "POST") {
      r.response = error_response(make_error(405, "invalid_request_error", "method_not_allowed", "use POST"));
      return r;
    }
    r.response = revoke(req, path.substr(kAdmin.size(), path.size() - kAdmin.size() - kRevoke.size()));
    return r;
  }
  r.response = error_response(make_error(404, "not_found_error", "not_found", "no route for " + req.method + " " + path));
  return r;
}

HttpResponse ApiService::models() const {
  json m = {{"id", opts_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "kvserve"},
            {"max_model_len", opts_.ctx}};
  return json_response(200, {{"object", "list"}, {"data", json::array({m})}});
}

HttpResponse ApiService::revoke(const HttpRequest& req, const std::string& tenant) {
  auto caller = tenants_.authenticate(req.authorization);
  if (!caller) return error_response(make_error(401, "authentication_error", "invalid_api_key", "missing or invalid API key"));
  if (!caller->policy.admin)
    return error_response(make_error(403, "permission_error", "not_admin", "this key may not administer tenants"));
  std::vector<Scope> retired;
  auto v = tenants_.revoke(tenant, &retired);
  if (!v) return error_response(make_error(404, "not_found_error", "tenant_not_found", "unknown tenant"));
  // The old scopes' cached blocks are freed now (the engine thread does it
  // between two steps; this waits for it).
  int64_t dropped = 0;
  for (const Scope& sc : retired) dropped += loop_.drop_scope(sc);
  std::fprintf(stderr, "kvserve: revoke tenant=%s permission_version=%lld dropped_blocks=%lld\n",
               tenant_hash(tenant).c_str(), static_cast<long long>(*v), static_cast<long long>(dropped));
  return json_response(200, {{"tenant", tenant}, {"permission_version", *v}, {"dropped_blocks", dropped}});
}

Routed ApiService::completions(Endpoint ep, const HttpRequest& req, std::function<void()> wake) {
  Routed out;
  if (!ready_) {
    out.response = fail(make_error(503, "service_unavailable", "loading", "the model is still loading"));
    return out;
  }
  if (draining_) {
    out.response = fail(make_error(503, "service_unavailable", "shutting_down", "the server is shutting down"),
                        "shutting_down");
    return out;
  }
  auto caller = tenants_.authenticate(req.authorization);
  if (!caller) {
    out.response = fail(make_error(401, "authentication_error", "invalid_api_key",
                                   "missing or invalid API key (Authorization: Bearer <key>)"),
                        "unauthorized");
    return out;
  }
  ParsedRequest p;
  try {
    p = parse_request(ep, req.body);
  } catch (const ApiError& e) {
    out.response = fail(e, "invalid");
    return out;
  }
  if (!p.model.empty() && p.model != opts_.model_id &&
      std::find(opts_.model_aliases.begin(), opts_.model_aliases.end(), p.model) == opts_.model_aliases.end()) {
    out.response = fail(make_error(404, "invalid_request_error", "model_not_found",
                                   "the model '" + p.model + "' does not exist; this server serves '" +
                                       opts_.model_id + "'"));
    return out;
  }

  // Tokens. Completions: plain text (special-token texts stay text, as in
  // `kvserve generate`); chat: the rendered template, whose markers are
  // special tokens.
  std::vector<int32_t> prompt;
  if (p.prompt_ids) {
    prompt = *p.prompt_ids;
    for (int32_t t : prompt)
      if (t >= tok_.n_vocab()) {
        out.response = fail(bad_request("'prompt' has a token id outside the vocabulary", "prompt"), "invalid");
        return out;
      }
  } else {
    const bool chat = ep == Endpoint::Chat;
    const std::string text = chat ? render_chat(opts_.chat, p.messages) : p.prompt;
    const std::vector<int> ids = tok_.encode(text, tok_.vocab().add_bos, chat);
    prompt.assign(ids.begin(), ids.end());
  }
  if (prompt.empty()) {
    out.response = fail(bad_request("the prompt is empty (no tokens)", "prompt"), "invalid");
    return out;
  }
  const int P = int(prompt.size());
  if (P >= opts_.ctx || (p.max_tokens && int64_t(P) + *p.max_tokens > opts_.ctx)) {
    ApiError e = bad_request("this model's context is " + std::to_string(opts_.ctx) + " tokens; the prompt has " +
                                 std::to_string(P) + " and max_tokens is " +
                                 (p.max_tokens ? std::to_string(*p.max_tokens) : std::string("unset")),
                             "max_tokens");
    e.code = "context_length_exceeded";
    out.response = fail(e, "context_length");
    return out;
  }
  const int max_tokens = p.max_tokens ? *p.max_tokens : std::min(opts_.default_max_tokens, opts_.ctx - P);

  // Service class: the key's class is the ceiling; a request may ask for
  // batch, never for better than its key allows.
  sched::SloClass slo = caller->policy.slo;
  if (p.slo && *p.slo == sched::SloClass::Batch) slo = sched::SloClass::Batch;

  // Per-tenant block quota (the key file's quota_blocks) on the worst case
  // of the tenant's in-flight requests: each choice's prompt + completion.
  const int bs = loop_.block_size();
  const int64_t need = int64_t(p.n) * ((int64_t(P) + max_tokens + bs - 1) / bs);
  int64_t reserved = 0;
  if (caller->policy.quota_blocks > 0) {
    if (!tenants_.try_reserve(caller->policy.id, need)) {
      ApiError e = make_error(429, "rate_limit_error", "tenant_quota",
                              "the tenant's KV block quota is in use by its other requests");
      e.retry_after_s = 1;
      out.response = fail(e, "tenant_quota");
      return out;
    }
    reserved = need;
  }

  const Scope scope = tenants_.scope_for(caller->policy.id, opts_.model_identity, sched::steady_now());
  std::string prefix_hash = "-";
  if (P >= bs) prefix_hash = to_hex(block_key(nullptr, prompt.data(), bs, scope)).substr(0, 16);

  Exchange::Setup s;
  s.loop = &loop_;
  s.tok = &tok_;
  s.tenants = &tenants_;
  s.counters = &counters_;
  s.endpoint = ep;
  s.stream = p.stream;
  s.include_usage = p.include_usage;
  s.logprobs = p.logprobs;
  s.n = p.n;
  char idbuf[40];
  std::snprintf(idbuf, sizeof idbuf, "%s%s%06llx", ep == Endpoint::Chat ? "chatcmpl-" : "cmpl-", id_salt_.c_str(),
                static_cast<unsigned long long>(next_id_++));
  s.meta.id = idbuf;
  s.meta.created = int64_t(std::time(nullptr));
  s.meta.model = opts_.model_id;
  s.tenant = caller->policy.id;
  s.quota_blocks = reserved;
  s.log_prefix = std::string("id=") + idbuf + " tenant=" + caller->tenant_hash + " prefix=" + prefix_hash +
                 " class=" + sched::to_string(slo) + (p.stream ? " stream" : "");
  s.queue_events = opts_.stream_queue_events;
  auto ex = std::make_shared<Exchange>(std::move(s));
  ex->queue()->set_wake(std::move(wake));

  sched::Request r;
  r.prompt = std::move(prompt);
  r.sampling = p.sampling;
  if (!p.seeded) r.sampling.seed = std::random_device{}();
  r.max_tokens = max_tokens;
  r.stop = p.stop;
  r.ignore_eos = p.ignore_eos;
  r.n = p.n;
  r.slo = slo;
  r.tenant = caller->tenant_hash;  // the loop's quota key and log field: a hash, never the id
  r.scope = scope;
  r.retention_s = caller->policy.retention_s;
  r.logprobs = p.logprobs;
  r.top_logprobs = p.top_logprobs;
  std::shared_ptr<EventQueue> q = ex->queue();
  r.sink = [q](sched::TokenEvent&& e) { return q->push(std::move(e)); };
  const sched::SubmitResult res = loop_.submit(std::move(r));
  if (!res.accepted) {
    // No events will come; the exchange gives the quota back and logs.
    const ApiError e = reject_error(res.reason, res.message, res.retry_after_s);
    ex->set_final_status(e.status);
    out.response = error_response(e);
    return out;  // `ex` is destroyed here (counts the status)
  }
  ex->set_request_id(res.id);
  out.exchange = std::move(ex);
  return out;
}

}  // namespace kvs::server
