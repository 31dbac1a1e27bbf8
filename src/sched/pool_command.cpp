#include "sched/pool_command.h"

namespace kvs::sched {

bool apply_pool_command(PoolCommand& c, StepExecutor& exec) {
  return std::visit(
      PoolVisitor{
          [&](pool_cmd::Release& r) {
            exec.release(r.seq);
            return true;
          },
          [&](pool_cmd::ReserveAdoption& r) {
            // Always answered: the UCX thread waits on it.
            AdoptionSlots s;
            try {
              if (HandoverPort* h = exec.handover()) s = h->reserve_adoption(r.prompt, r.caller);
              else s.error = "this worker takes no KV hand-overs";
            } catch (const std::exception& e) {
              s = AdoptionSlots{};
              s.error = e.what();
            }
            r.slots.set_value(std::move(s));
            return true;
          },
          [&](pool_cmd::FinishAdoption& f) {
            std::string error;
            try {
              if (HandoverPort* h = exec.handover()) h->finish_adoption(f.seq, f.prompt);
              else error = "this worker takes no KV hand-overs";
            } catch (const std::exception& e) {
              error = e.what();
            }
            f.done.set_value(error);
            return true;
          },
          [&](pool_cmd::AbortAdoption& a) {
            exec.release(a.seq);
            return true;
          },
          [](auto&) { return false; },
      },
      c);
}

void refuse_pool_command(PoolCommand& c) {
  std::visit(PoolVisitor{
                 [](pool_cmd::DropScope& d) { d.freed.set_value(0); },
                 [](pool_cmd::ReserveAdoption& r) {
                   AdoptionSlots s;
                   s.error = "the server is shutting down";
                   r.slots.set_value(std::move(s));
                 },
                 [](pool_cmd::FinishAdoption& f) { f.done.set_value("the server is shutting down"); },
                 [](auto&) {},
             },
             c);
}

}  // namespace kvs::sched
