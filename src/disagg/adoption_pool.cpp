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
  // Block by block, each table's entry the next query sees: the list order
  // the decode side reserves in (KvManager::Adoption). A table whose layers'
  // own window hid an entry has freed it; a window policy cannot ship.
  const int bs = pe.block_size();
  const size_t n = (s.prompt.size() + size_t(bs) - 1) / size_t(bs);
  const int len = int(s.prompt.size());
  for (const std::vector<int32_t>& table : kv.block_tables(seq))
    if (table.size() < n) throw std::invalid_argument("disagg: the sequence's table is shorter than its prompt");
  for (size_t i = 0; i < n; ++i)
    for (int t = 0; t < kv.n_tables(); ++t) {
      const int32_t b = kv.block_table(seq, t)[i];
      const TableWindow& w = kv.table_window(t);
      if (b >= 0) s.blocks.push_back(pe.block(b));
      else if (w.policy.active() || !w.dead(int64_t(i) * bs, int64_t(i + 1) * bs, len))
        throw std::invalid_argument("disagg: a windowed sequence cannot be shipped");
    }
  const std::span<const float> res = kv.residual_view(seq);
  s.residual.assign(res.begin(), res.end());
  return s;
}

}  // namespace kvs::disagg
