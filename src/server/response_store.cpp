#include "server/response_store.h"

namespace kvs::server {

void ResponseStore::put(const std::string& tenant, const std::string& id, Conversation conversation,
                        nlohmann::json response, double now, double ttl_s) {
  std::lock_guard lk(mu_);
  const std::string k = key(tenant, id);
  auto it = entries_.find(k);
  if (it != entries_.end()) {
    order_.erase(it->second.age);
    entries_.erase(it);
  }
  while (entries_.size() >= max_ && !order_.empty()) {
    entries_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(k);
  entries_[k] = Entry{std::move(conversation), std::move(response), now + ttl_s, std::prev(order_.end())};
}

std::unordered_map<std::string, ResponseStore::Entry>::iterator ResponseStore::live(const std::string& tenant,
                                                                                   const std::string& id, double now) {
  auto it = entries_.find(key(tenant, id));
  if (it == entries_.end() || now <= it->second.expires) return it;
  order_.erase(it->second.age);
  entries_.erase(it);
  return entries_.end();
}

std::optional<Conversation> ResponseStore::get(const std::string& tenant, const std::string& id, double now) {
  std::lock_guard lk(mu_);
  auto it = live(tenant, id, now);
  if (it == entries_.end()) return std::nullopt;
  return it->second.conversation;
}

std::optional<nlohmann::json> ResponseStore::object(const std::string& tenant, const std::string& id, double now) {
  std::lock_guard lk(mu_);
  auto it = live(tenant, id, now);
  if (it == entries_.end()) return std::nullopt;
  return it->second.response;
}

bool ResponseStore::erase(const std::string& tenant, const std::string& id, double now) {
  std::lock_guard lk(mu_);
  auto it = live(tenant, id, now);
  if (it == entries_.end()) return false;
  order_.erase(it->second.age);
  entries_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lk(mu_);
  return entries_.size();
}

}  // namespace kvs::server
