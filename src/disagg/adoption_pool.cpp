#include "disagg/adoption_pool.h"

#include <future>
#include <stdexcept>

#include "model/model.h"

namespace kvs::disagg {

KvIdentity identity_of(const PagedEngine& pe) {
  return make_identity(const_cast<PagedEngine&>(pe).engine().model().identity(), pe.layout());
}

PagedAdoptionPool::PagedAdoptionPool(const PagedEngine& pe, sched::PoolInbox& inbox)
    : pe_(pe), inbox_(inbox), id_(identity_of(pe)) {}

std::vector<BlockKey> PagedAdoptionPool::chain_keys(std::span<const int32_t> prompt, const Scope& caller) const {
  return pe_.kv().chain_keys(prompt, pe_.kv_scope(caller));
}

AdoptionPool::Reservation PagedAdoptionPool::reserve(std::span<const int32_t> prompt, const Scope& caller) {
  sched::pool_cmd::ReserveAdoption c;
  c.prompt.assign(prompt.begin(), prompt.end());
  c.caller = caller;
  std::future<sched::AdoptionSlots> f = c.slots.get_future();
  inbox_.post(std::move(c));
  return f.get();
}

std::string PagedAdoptionPool::finish(SeqId seq, std::span<const int32_t> prompt) {
  sched::pool_cmd::FinishAdoption c;
  c.seq = seq;
  c.prompt.assign(prompt.begin(), prompt.end());
  std::future<std::string> f = c.done.get_future();
  inbox_.post(std::move(c));
  return f.get();
}

void PagedAdoptionPool::abort(SeqId seq) { inbox_.post(sched::pool_cmd::AbortAdoption{seq}); }

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
