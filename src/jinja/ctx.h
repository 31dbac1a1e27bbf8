// What one render shares with values, filters and calls: the limits and
// their counters, the clock, and the ways back into the interpreter
// (filters by name, tests by name, calling a value).
#pragma once
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>

#include "jinja/value.h"

namespace kvs::jinja {

// Bounds on one render, so that no template can hang or exhaust the server.
struct Limits {
  uint64_t max_output_bytes = uint64_t(64) << 20;  // the rendered text
  uint64_t max_work_bytes = uint64_t(1) << 30;     // every string and list built on the way, summed
  uint64_t max_steps = 20'000'000;                 // statements and expressions evaluated
  uint64_t max_loop_iterations = 5'000'000;        // for-loop iterations, all loops together
  int max_call_depth = 100;                        // nested macro, caller and recursive-loop calls
};

class Ctx {
 public:
  explicit Ctx(const Limits& limits) : limits_(limits) {}
  virtual ~Ctx() = default;
  const Limits& limits() const { return limits_; }

  // Accounts for `bytes` of new strings or list slots; throws past the budget.
  void charge(uint64_t bytes);
  void step();
  void iteration();

  virtual Value filter(const std::string& name, const Value& v, Args args) = 0;
  virtual bool test(const std::string& name, const Value& v, Args args) = 0;
  virtual Value call(const Value& fn, Args args) = 0;
  virtual std::tm now() = 0;  // for strftime_now
  // Objects made during the render that may hold references to each other;
  // their drop_refs runs when the render ends.
  virtual void adopt(const std::shared_ptr<Object>& o) = 0;

 private:
  const Limits& limits_;
  uint64_t work_ = 0, steps_ = 0, iterations_ = 0;
};

}  // namespace kvs::jinja
