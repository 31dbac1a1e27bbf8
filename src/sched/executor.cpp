#include "sched/executor.h"

#include <string>

#include "model/model.h"

namespace kvs::sched {

Scope PagedExecutor::kv_scope(const Scope& caller) const { return pe_.kv_scope(caller); }

int PagedExecutor::n_vocab() const { return const_cast<PagedEngine&>(pe_).engine().model().config().n_vocab; }

}  // namespace kvs::sched
