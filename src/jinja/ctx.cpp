#include "jinja/ctx.h"

#include "jinja/error.h"

namespace kvs::jinja {

void Ctx::charge(uint64_t bytes) {
  work_ += bytes;
  if (work_ > limits_.max_work_bytes)
    throw EvalError("the render built more than " + std::to_string(limits_.max_work_bytes) +
                        " bytes of strings and lists (Limits::max_work_bytes)",
                    ErrorKind::Limit);
}

void Ctx::step() {
  if (++steps_ > limits_.max_steps)
    throw EvalError("the render took more than " + std::to_string(limits_.max_steps) + " steps (Limits::max_steps)",
                    ErrorKind::Limit);
}

void Ctx::iteration() {
  if (++iterations_ > limits_.max_loop_iterations)
    throw EvalError("the render ran more than " + std::to_string(limits_.max_loop_iterations) +
                        " loop iterations (Limits::max_loop_iterations)",
                    ErrorKind::Limit);
}

}  // namespace kvs::jinja
