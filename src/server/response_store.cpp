#include "server/response_store.h"

namespace kvs::server {

void ResponseStore::put(const std::string& tenant, const std::string& id, Conversation conversation,
                        double now, double ttl_s) {
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
  entries_[k] = Entry{std::move(conversation), now + ttl_s, std::prev(order_.end())};
}

std::optional<Conversation> ResponseStore::get(const std::string& tenant, const std::string& id,
                                                           double now) {
  std::lock_guard lk(mu_);
  auto it = entries_.find(key(tenant, id));
  if (it == entries_.end()) return std::nullopt;
  if (now > it->second.expires) {
    order_.erase(it->second.age);
    entries_.erase(it);
    return std::nullopt;
  }
  return it->second.conversation;
}

size_t ResponseStore::size() const {
  std::lock_guard lk(mu_);
  return entries_.size();
}

}  // namespace kvs::server
