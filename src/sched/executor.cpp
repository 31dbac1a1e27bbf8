#include "sched/executor.h"

#include <string>

#include "model/model.h"

namespace kvs::sched {

Scope PagedExecutor::kv_scope(const Scope& caller) const {
  // Must match PagedEngine::add, or probes would miss blocks add() finds.
  const std::string_view bytes(reinterpret_cast<const char*>(caller.bytes.data()), caller.bytes.size());
  return make_scope(const_cast<PagedEngine&>(pe_).engine().model().identity(), bytes);
}

int PagedExecutor::n_vocab() const { return const_cast<PagedEngine&>(pe_).engine().model().config().n_vocab; }

}  // namespace kvs::sched
