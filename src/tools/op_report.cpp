#include "tools/op_report.h"

#include <algorithm>
#include <cstdio>

namespace kvs::tools {

namespace {

double ms_per_token(double s, int64_t tokens) { return tokens > 0 ? 1e3 * s / double(tokens) : 0.0; }
double share(double s, double wall) { return wall > 0 ? s / wall : 0.0; }
// The wall time the timed phases do not cover (never negative: the clock
// reads of the phases and of the caller differ by a few microseconds).
double other_s(const OpColumn& c) { return std::max(0.0, c.wall_s - c.ops.total()); }

std::string cell(double s, const OpColumn& c) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f | %.1f%%", ms_per_token(s, c.tokens), 100 * share(s, c.wall_s));
  return buf;
}

}  // namespace

void add_op_times(OpTimes& a, const OpTimes& b) {
  for (int i = 0; i < kOpPhases; ++i) a.seconds[i] += b.seconds[i];
}

std::string format_op_table(const std::vector<OpColumn>& cols) {
  std::string out = "| phase |";
  std::string rule = "|---|";
  for (const OpColumn& c : cols) {
    out += " " + c.test + " ms/token | share |";
    rule += "---|---|";
  }
  out += "\n" + rule + "\n";
  for (int i = 0; i < kOpPhases; ++i) {
    const bool used = std::any_of(cols.begin(), cols.end(), [&](const OpColumn& c) { return c.ops.seconds[i] > 0; });
    if (!used) continue;
    out += std::string("| ") + op_phase_name(OpPhase(i)) + " |";
    for (const OpColumn& c : cols) out += " " + cell(c.ops.seconds[i], c) + " |";
    out += "\n";
  }
  out += "| other |";
  for (const OpColumn& c : cols) out += " " + cell(other_s(c), c) + " |";
  out += "\n| total |";
  for (const OpColumn& c : cols) out += " " + cell(std::max(c.wall_s, c.ops.total()), c) + " |";
  return out + "\n";
}

nlohmann::json op_json(const OpColumn& c) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kOpPhases; ++i) {
    if (c.ops.seconds[i] <= 0) continue;
    j[op_phase_name(OpPhase(i))] = {{"ms_per_token", ms_per_token(c.ops.seconds[i], c.tokens)},
                                    {"share", share(c.ops.seconds[i], c.wall_s)}};
  }
  j["other"] = {{"ms_per_token", ms_per_token(other_s(c), c.tokens)}, {"share", share(other_s(c), c.wall_s)}};
  return j;
}

}  // namespace kvs::tools
