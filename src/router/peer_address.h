// Disaggregated serving: a prefill worker's --decode-peer and a decode
// worker's --kv-listen are HOST:PORT strings written by different people
// ("localhost:19100" and "127.0.0.1:19100"); the router pairs them by the
// addresses they resolve to, not by spelling.
#pragma once
#include <string>
#include <vector>

namespace kvs::router {

// Every "IP:PORT" (IPv6 as "[IP]:PORT") that `host_port` resolves to; a
// bracketed IPv6 host is allowed. Empty when it does not resolve or has no
// port. Blocking (getaddrinfo): call it off the request path.
std::vector<std::string> resolve_peer(const std::string& host_port);

}  // namespace kvs::router
