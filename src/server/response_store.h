// What /v1/responses keeps for previous_response_id and for
// GET /v1/responses/{id}: each stored response's whole conversation (its
// input, after the previous responses it continued, and its output) and the
// response object it answered with, per tenant. A response is found only by the tenant that
// made it, expires after the tenant's retention (an hour without one), and
// the store is bounded: the oldest go first. The KV blocks of the
// conversation stay in the prefix cache under the tenant's scope and
// retention, so a continuation is mostly prefix hits.
//
// Thread-safe (HTTP threads).
#pragma once
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvs::server {

// Chat messages in OpenAI's shape (role, content, tool_calls, tool_call_id).
using Conversation = nlohmann::ordered_json;

class ResponseStore {
 public:
  explicit ResponseStore(size_t max_entries = 10000) : max_(max_entries) {}
  // `now` and `ttl_s` in seconds on one clock.
  void put(const std::string& tenant, const std::string& id, Conversation conversation,
           nlohmann::json response, double now, double ttl_s);
  std::optional<Conversation> get(const std::string& tenant, const std::string& id, double now);
  // The response object as it was answered.
  std::optional<nlohmann::json> object(const std::string& tenant, const std::string& id, double now);
  // False where the tenant has no such (unexpired) response.
  bool erase(const std::string& tenant, const std::string& id, double now);
  size_t size() const;

 private:
  struct Entry {
    Conversation conversation;
    nlohmann::json response;
    double expires = 0;
    std::list<std::string>::iterator age;
  };
  // The live entry, or end() (an expired one is dropped on the way).
  std::unordered_map<std::string, Entry>::iterator live(const std::string& tenant, const std::string& id, double now);
  static std::string key(const std::string& tenant, const std::string& id) { return tenant + '\n' + id; }
  size_t max_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> order_;  // oldest first
};

}  // namespace kvs::server
