// The workers' routes beyond completions, through the router: stateless
// ones (a model by id, the token tools, embeddings' explanation) go to the
// least loaded up worker; stored responses (the Responses API) live on the
// worker that made them, so the router finds that worker by asking.
#include <cctype>
#include <nlohmann/json.hpp>

#include "router/router_impl.h"

namespace kvs::router {

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.size() > p.size() && s.compare(0, p.size(), p) == 0; }

// A revoke changes one worker's permission versions: sent to one worker by
// the router it would leave the others serving the revoked scope.
std::string revoke_not_routed(bool keep_alive) {
  return respond(404, "application/json",
                 error_json("not_found_error", "not_routed",
                            "the router does not route tenant revokes: POST /admin/tenants/{id}/revoke to every "
                            "worker, then restart the router with the new --api-keys file"),
                 keep_alive);
}

}  // namespace

std::optional<bool> RouterServer::Impl::other_route(Conn& client, const http::request<http::string_body>& req,
                                                    const std::string& path, bool keep_alive) {
  if (starts_with(path, "/v1/models/") || path == "/tokenize" || path == "/detokenize" || path == "/apply-template" ||
      path == "/v1/embeddings" || path == "/embeddings")
    return proxy(client, req, keep_alive, false);
  if (starts_with(path, "/v1/responses/") || starts_with(path, "/responses/"))
    return stored_response(client, req, keep_alive);
  if (path == "/v1/responses" || path == "/responses") return responses(client, req, keep_alive);
  if (starts_with(path, "/admin/tenants/")) return write(client, revoke_not_routed(keep_alive));
  return std::nullopt;
}

bool RouterServer::Impl::stored_response(Conn& client, const http::request<http::string_body>& req, bool keep_alive) {
  const std::vector<WorkerView> view = workers.snapshot();
  std::vector<bool> tried(view.size(), false);
  std::optional<Relay> missing;  // a worker's 404: it does not hold the id
  std::string reasons;
  bool all_asked = true;
  for (int w = 0; w < int(view.size()); ++w) {
    if (!view[size_t(w)].up) {
      all_asked = false;
      continue;
    }
    tried[size_t(w)] = true;
    Relay r = leg(w, req, client, keep_alive, false);
    if (r.client_gone) return false;
    if (r.failover) {
      all_asked = false;
      reasons += (reasons.empty() ? "" : "; ") + workers.spec(w).url + ": " + r.error;
      continue;
    }
    if (r.status == 404) {
      missing = std::move(r);
      continue;
    }
    return write(client, respond(r.status, r.content_type, r.body, keep_alive, r.retry_after));
  }
  // Every worker said it has no such response: that answer is the workers'.
  if (missing && all_asked) return write(client, respond(404, missing->content_type, missing->body, keep_alive));
  // A worker that could not be asked may hold it: not a 404.
  return answer_no_worker(client, tried, reasons, keep_alive);
}

int RouterServer::Impl::holder_of(const std::string& id, const http::request<http::string_body>& req, Conn& client) {
  http::request<http::string_body> probe{http::verb::get, "/v1/responses/" + id, 11};
  if (!req[http::field::authorization].empty()) probe.set(http::field::authorization, req[http::field::authorization]);
  const std::vector<WorkerView> view = workers.snapshot();
  for (int w = 0; w < int(view.size()); ++w) {
    if (!view[size_t(w)].up) continue;
    const Relay r = relay(w, probe, client, false, false);
    if (r.client_gone) return -1;
    if (!r.failover && r.status == 200) return w;
  }
  return -1;
}

bool RouterServer::Impl::responses(Conn& client, const http::request<http::string_body>& req, bool keep_alive) {
  if (!opts.prefill_workers.empty())
    return write(client, respond(404, "application/json",
                                 error_json("not_found_error", "not_routed",
                                            "a prefill/decode router does not route /v1/responses: use "
                                            "/v1/chat/completions, or a router over --worker workers"),
                                 keep_alive));
  const nlohmann::json body = nlohmann::json::parse(req.body(), nullptr, false);
  const nlohmann::json* prev = body.is_object() && body.contains("previous_response_id")
                                   ? &body["previous_response_id"] : nullptr;
  // No earlier turn (or a malformed one, which any worker refuses alike): any worker.
  if (!prev || !prev->is_string() || prev->get<std::string>().empty()) return proxy(client, req, keep_alive, false);
  const std::string id = prev->get<std::string>();
  // The id goes into a request line: anything but an id's characters could
  // forge one, and no worker stored such an id anyway.
  for (const char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      return proxy(client, req, keep_alive, false);
  const int w = holder_of(id, req, client);
  // Not found on any up worker: a worker answers its own "not found".
  if (w < 0) return proxy(client, req, keep_alive, false);
  Relay r = leg(w, req, client, keep_alive);
  if (r.client_gone) return false;
  if (r.failover)
    return write(client, respond(502, "application/json",
                                 error_json("server_error", "worker_failed",
                                            "the worker holding previous response '" + id + "' (" +
                                                workers.spec(w).url + ") failed before answering (" + r.error +
                                                "); the conversation is stored there: retry when it is back"),
                                 keep_alive));
  if (!r.sent) return write(client, respond(r.status, r.content_type, r.body, keep_alive, r.retry_after));
  return keep_alive && r.status != 0;
}

}  // namespace kvs::router
