#include "cli/disagg_args.h"
#include "disagg/ucx_link.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace kvs::cli {

namespace {

// HOST:PORT; throws naming the flag.
std::pair<std::string, uint16_t> host_port(const std::string& flag, const std::string& v) {
  const size_t colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == v.size())
    throw std::runtime_error(flag + " '" + v + "': expected HOST:PORT");
  try {
    size_t used = 0;
    const int p = std::stoi(v.substr(colon + 1), &used);
    if (used != v.size() - colon - 1 || p < 0 || p > 65535) throw std::out_of_range("port");
    return {v.substr(0, colon), uint16_t(p)};
  } catch (const std::exception&) {
    throw std::runtime_error(flag + " '" + v + "': the port must be a number from 0 to 65535");
  }
}

void counter(std::string& out, const char* name, const char* help, const std::string& role, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + "{role=\"" + role +
         "\"} " + buf + "\n";
}

}  // namespace

void add_disagg_args(CLI::App* c, DisaggArgs& a) {
  c->add_option("--role", a.role,
                "both: prefill and decode here; prefill: hand every request to --decode-peer after its first token; "
                "decode: continue requests handed over by prefill workers")
      ->capture_default_str()->check(CLI::IsMember({"both", "prefill", "decode"}));
  c->add_option("--kv-listen", a.kv_listen, "Decode worker: UCX address prefill workers send KV blocks to (port 0: any)")
      ->capture_default_str();
  c->add_option("--decode-peer", a.decode_peers,
                "Prefill worker: a decode worker's --kv-listen address (HOST:PORT); repeat for several. A request "
                "goes to the one the router names (?kv_decode_peer=), else to the first");
  c->add_option("--kv-transfer-timeout", a.transfer_timeout_s, "Seconds one KV transfer may take")
      ->capture_default_str()->check(CLI::Range(0.1, 3600.0));
  c->add_option("--kv-claim-timeout", a.claim_timeout_s,
                "Decode worker: seconds received KV blocks wait for their request before they are freed")
      ->capture_default_str()->check(CLI::Range(0.1, 3600.0));
  c->add_option("--kv-unclaimed-max-blocks", a.unclaimed_max_blocks,
                "Decode worker: KV blocks that hand-overs no request has come for yet may hold, the newest aside; "
                "over it the oldest are freed (anyone who can post to a prefill worker makes hand-overs). Default: "
                "a quarter of the KV pool; 0: no bound")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
}

void check_disagg_args(const DisaggArgs& a, bool has_cache_secret) {
  if (a.unclaimed_max_blocks >= 0 && a.role != "decode")
    throw std::runtime_error("--kv-unclaimed-max-blocks bounds a decode worker's hand-overs: it needs --role decode");
  if (a.role == "both") return;
  // The decode side checks that a handed-over request is the one whose
  // blocks arrived, scope included: both workers must derive equal scopes.
  if (!has_cache_secret)
    throw std::runtime_error("--role " + a.role +
                             " needs --cache-secret-file (or a KV tier key), the same file on prefill and decode workers");
  if (a.role == "prefill" && a.decode_peers.empty())
    throw std::runtime_error("--role prefill needs --decode-peer HOST:PORT");
  if (a.role == "prefill")
    for (const std::string& p : a.decode_peers) host_port("--decode-peer", p);
  if (a.role == "decode") host_port("--kv-listen", a.kv_listen);
}

void set_ucx_defaults(const DisaggArgs& a) {
  // A decode worker restarted after a crash listens on the same address
  // while the dead one's connections linger in TIME_WAIT. UCX 1.13 takes
  // this connection-manager setting from the environment only.
  if (a.role == "decode") ::setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
  if (a.role != "both") disagg::widen_ucx_segments();
}

DisaggRoles start_roles(const DisaggArgs& a, sched::PagedExecutor& exec, sched::EngineLoop& loop) {
  DisaggRoles r;
  auto log = [](const std::string& s) { std::fprintf(stderr, "kvserve: %s\n", s.c_str()); };
  if (a.role == "decode") {
    disagg::DecodeOptions o;
    std::tie(o.host, o.port) = host_port("--kv-listen", a.kv_listen);
    r.kv_host = o.host;
    o.transfer_timeout_s = a.transfer_timeout_s;
    o.claim_timeout_s = a.claim_timeout_s;
    o.unclaimed_max_blocks =
        a.unclaimed_max_blocks >= 0 ? a.unclaimed_max_blocks : std::max<int64_t>(1, exec.paged().n_blocks() / 4);
    r.decode = std::make_unique<disagg::DecodeRole>(exec, loop, o, log);
  } else if (a.role == "prefill") {
    std::vector<disagg::PrefillOptions> peers;
    for (const std::string& p : a.decode_peers) {
      disagg::PrefillOptions o;
      std::tie(o.host, o.port) = host_port("--decode-peer", p);
      o.timeout_s = a.transfer_timeout_s;
      peers.push_back(o);
    }
    r.prefill = std::make_unique<disagg::PrefillRole>(exec, loop, peers, log);
  }
  return r;
}

std::string DisaggRoles::describe() const {
  if (decode) return "role decode, KV transfers received on ucx port " + std::to_string(decode->port());
  if (prefill) {
    std::string s = "role prefill, KV transfers sent to ";
    for (const std::string& p : prefill->peers()) s += (s.back() == ' ' ? "" : ", ") + p;
    return s;
  }
  return "role both";
}

nlohmann::json DisaggRoles::health_fields() const {
  if (decode) return {{"role", "decode"}, {"kv_listen", kv_host + ":" + std::to_string(decode->port())}};
  if (prefill) return {{"role", "prefill"}, {"decode_peers", prefill->peers()}};
  return {{"role", "both"}};
}

std::string DisaggRoles::metrics_text() const {
  if (!decode && !prefill) return {};
  const disagg::TransferStats s = decode ? decode->stats() : prefill->stats();
  const std::string role = decode ? "decode" : "prefill";
  std::string out;
  counter(out, "kvserve_kv_transfer_bytes_total", "KV block bytes moved between prefill and decode workers", role,
          double(s.bytes));
  counter(out, "kvserve_kv_transfer_blocks_total", "KV blocks moved between prefill and decode workers", role,
          double(s.blocks));
  counter(out, "kvserve_kv_transfer_seconds_total", "Seconds of KV transfers, offer to result", role, s.seconds);
  counter(out, "kvserve_kv_transfer_skipped_blocks_total", "KV blocks not sent: the decode worker had them", role,
          double(s.skipped_blocks));
  counter(out, "kvserve_kv_transfers_total", "KV transfers completed", role, double(s.transfers));
  counter(out, "kvserve_kv_transfer_failures_total", "KV transfers that failed", role, double(s.failed));
  counter(out, "kvserve_kv_transfer_no_room_total", "KV transfers the decode worker had no room for", role,
          double(s.no_room));
  if (decode) {
    counter(out, "kvserve_kv_transfer_unclaimed_released_total",
            "Hand-overs freed before any request came for them: over --kv-unclaimed-max-blocks", role,
            double(s.unclaimed_released));
    out += "# HELP kvserve_kv_transfer_unclaimed_blocks KV blocks held by hand-overs no request has come for yet\n"
           "# TYPE kvserve_kv_transfer_unclaimed_blocks gauge\nkvserve_kv_transfer_unclaimed_blocks{role=\"decode\"} " +
           std::to_string(decode->unclaimed_blocks()) + "\n";
  }
  if (decode)
    out += "# HELP kvserve_kv_transfer_holding Transfers in flight plus adopted sequences not yet claimed by a request\n"
           "# TYPE kvserve_kv_transfer_holding gauge\nkvserve_kv_transfer_holding{role=\"decode\"} " +
           std::to_string(decode->holding()) + "\n";
  return out;
}

}  // namespace kvs::cli
