#include "disagg/adoption_pool.h"

#include <stdexcept>

#include "model/model.h"

namespace kvs::disagg {

KvIdentity identity_of(const PagedEngine& pe) {
  return make_identity(const_cast<PagedEngine&>(pe).engine().model().identity(), pe.layout());
}

PagedAdoptionPool::PagedAdoptionPool(PagedEngine& pe, std::mutex& mu) : pe_(pe), mu_(mu), id_(identity_of(pe)) {}

std::vector<BlockKey> PagedAdoptionPool::chain_keys(std::span<const int32_t> prompt, const Scope& caller) const {
  return pe_.kv().chain_keys(prompt, pe_.kv_scope(caller));  // pure: no lock
}

AdoptionPool::Reservation PagedAdoptionPool::reserve(std::span<const int32_t> prompt, const Scope& caller) {
  Reservation r;
  std::lock_guard lk(mu_);
  KvManager::Adoption a;
  try {
    a = pe_.reserve_adoption(prompt, caller);
  } catch (const std::exception& e) {
    r.error = e.what();
    return r;
  }
  if (a.seq < 0) return r;
  r.seq = a.seq;
  r.hit_blocks = a.hit_blocks;
  const auto& table = pe_.kv().block_table(a.seq);
  for (int32_t i = a.hit_blocks; i < a.blocks; ++i) r.blocks.push_back(pe_.block(table[size_t(i)]));
  r.residual = pe_.residual(a.seq);
  return r;
}

void PagedAdoptionPool::finish(SeqId seq, std::span<const int32_t> prompt) {
  std::lock_guard lk(mu_);
  pe_.finish_adoption(seq, prompt);
}

void PagedAdoptionPool::abort(SeqId seq) {
  std::lock_guard lk(mu_);
  pe_.release(seq);
}

Shipment shipment_of(PagedEngine& pe, SeqId seq, const Scope& caller, int32_t first_token) {
  const KvManager& kv = pe.kv();
  Shipment s;
  s.prompt = kv.tokens(seq);
  if (s.prompt.empty()) throw std::invalid_argument("disagg: the sequence holds no prompt");
  s.scope = caller;
  s.first_token = first_token;
  s.keys = kv.chain_keys(s.prompt, pe.kv_scope(caller));
  const auto& table = kv.block_table(seq);
  const size_t n = (s.prompt.size() + size_t(pe.block_size()) - 1) / size_t(pe.block_size());
  if (table.size() < n) throw std::invalid_argument("disagg: the sequence's table is shorter than its prompt");
  for (size_t i = 0; i < n; ++i) {
    if (table[i] < 0) throw std::invalid_argument("disagg: a windowed sequence cannot be shipped");
    s.blocks.push_back(pe.block(table[i]));
  }
  const std::span<const float> res = kv.residual_view(seq);
  s.residual.assign(res.begin(), res.end());
  return s;
}

}  // namespace kvs::disagg
