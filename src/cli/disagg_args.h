// The disaggregated-serving flags of `kvserve serve` (docs/DISAGG.md):
// --role prefill|decode|both, the decode worker's UCX listen address and
// the prefill worker's decode peer, and the role objects they start.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "disagg/decode_role.h"
#include "disagg/prefill_role.h"

namespace kvs::cli {

struct DisaggArgs {
  std::string role = "both";
  std::string kv_listen = "127.0.0.1:0";  // decode: where prefill workers connect (UCX)
  std::vector<std::string> decode_peers;  // prefill: decode workers' --kv-listen addresses (first: the default)
  double transfer_timeout_s = 10, claim_timeout_s = 30;
  // Decode: blocks of hand-overs no request came for yet (the newest
  // aside); -1: not given (a quarter of the KV pool), 0: no bound.
  int64_t unclaimed_max_blocks = -1;
};
void add_disagg_args(CLI::App* cmd, DisaggArgs& a);
// Flag errors, before the model loads (throws std::runtime_error naming the flag).
void check_disagg_args(const DisaggArgs& a, bool has_cache_secret);
// UCX settings the roles need, through UCX's environment (read when the
// link starts); call before any other thread exists. A setting already in
// the environment is kept.
void set_ucx_defaults(const DisaggArgs& a);

// The role objects of one serve process (none for `both`).
struct DisaggRoles {
  std::unique_ptr<disagg::DecodeRole> decode;
  std::unique_ptr<disagg::PrefillRole> prefill;
  std::string describe() const;  // for the ready line
  // What /health adds: a decode worker's KV address, a prefill worker's
  // decode peers (the router pairs them per request from these).
  nlohmann::json health_fields() const;
  std::string kv_host;  // decode: the host part of --kv-listen
  std::string metrics_text() const;  // kvserve_kv_transfer_* in Prometheus text
};
DisaggRoles start_roles(const DisaggArgs& a, sched::PagedExecutor& exec, sched::EngineLoop& loop);

}  // namespace kvs::cli
