// What other threads ask of the KV pool, as plain commands for its one
// writer (the engine thread, kv/owner_thread.h). A thread posts a command
// to a PoolInbox and never touches KvManager or BlockPool itself; the owner
// drains its inbox between two steps and answers through the command's
// promise where it has an answer.
//
//   HTTP (admin revoke)   DropScope       -> blocks freed
//   device shedding       DropAll
//   dashboard             View            -> the pool cell by cell (EngineLoop::pool_view)
//   prefill shipper       Release         (a handed-off sequence, shipped)
//   UCX progress thread   ReserveAdoption -> AdoptionSlots; FinishAdoption -> ok; AbortAdoption
//
// A command posted after the owner has stopped is answered at once: no
// blocks freed, no slots, no adoption ("shutting down"); the others are
// dropped with the pool.
#pragma once
#include <cstdint>
#include <future>
#include <string>
#include <variant>
#include <vector>

#include "sched/executor.h"

namespace kvs::sched {

namespace pool_cmd {
struct DropScope {  // the prefix cache of a caller scope (a revoked tenant)
  Scope scope;
  std::promise<int64_t> freed;  // cached blocks freed now
};
struct DropAll {};  // every cached block (a cold prefix cache)
struct View {       // a PoolView in at most max_cells cells, taken between two steps
  int32_t max_cells = 1;
};
struct Release {  // a sequence a hand-off event gave away, now shipped
  SeqId seq = -1;
};
struct ReserveAdoption {  // HandoverPort::reserve_adoption
  std::vector<int32_t> prompt;
  Scope caller;
  std::promise<AdoptionSlots> slots;
};
struct FinishAdoption {  // HandoverPort::finish_adoption: the bytes arrived
  SeqId seq = -1;
  std::vector<int32_t> prompt;
  // Answered once the blocks are keyed, before anyone may claim the
  // sequence: "" or why it could not be adopted.
  std::promise<std::string> done;
};
struct AbortAdoption {  // the transfer failed or was never claimed: blocks back
  SeqId seq = -1;
};
}  // namespace pool_cmd

using PoolCommand = std::variant<pool_cmd::DropScope, pool_cmd::DropAll, pool_cmd::View, pool_cmd::Release,
                                 pool_cmd::ReserveAdoption, pool_cmd::FinishAdoption, pool_cmd::AbortAdoption>;

// std::visit over a PoolCommand with one lambda per kind (and a generic
// `auto&` one for the rest).
template <class... F>
struct PoolVisitor : F... {
  using F::operator()...;
};
template <class... F>
PoolVisitor(F...) -> PoolVisitor<F...>;

class PoolInbox {
 public:
  virtual ~PoolInbox() = default;
  // Any thread; never waits for a step.
  virtual void post(PoolCommand c) = 0;
};

// On the owner thread: runs a Release or one of the adoption commands
// against `exec` (answering its promise). False, doing nothing, for the
// other kinds, which need the engine loop's own state.
bool apply_pool_command(PoolCommand& c, StepExecutor& exec);

// Answers a command that can no longer run (its owner has stopped).
void refuse_pool_command(PoolCommand& c);

}  // namespace kvs::sched
