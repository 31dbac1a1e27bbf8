// The per-op timer's report (Engine::set_op_timing), as `kvserve bench --ops`
// prints it: per phase of the forward pass, milliseconds per token and
// share of the measured wall time. "other" is the part of that wall time
// outside the timed forwards (the caller's work: block bookkeeping).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvserve/engine.h"

namespace kvs::tools {

struct OpColumn {
  std::string test;    // e.g. "pp512"
  OpTimes ops;         // summed over the measured runs
  double wall_s = 0;   // their wall time
  int64_t tokens = 0;  // tokens they produced or prefilled
};

// Adds b's phase times to a.
void add_op_times(OpTimes& a, const OpTimes& b);

// A markdown table: one row per phase that took time in any column, then
// "other" and the total; per column ms/token and % of wall time.
std::string format_op_table(const std::vector<OpColumn>& cols);

// {"<phase>": {"ms_per_token", "share"}, ..., "other": {...}} of one column.
nlohmann::json op_json(const OpColumn& c);

}  // namespace kvs::tools
