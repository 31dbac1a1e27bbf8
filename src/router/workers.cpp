#include "router/workers.h"

#include "kv/prefix_chain.h"
#include "router/peer_address.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace kvs::router {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

std::string next_port(const std::string& ep) {
  const size_t colon = ep.rfind(':');
  if (ep.compare(0, 6, "tcp://") != 0 || colon == std::string::npos)
    throw std::runtime_error("events endpoint '" + ep + "': expected tcp://HOST:PORT");
  try {
    return ep.substr(0, colon + 1) + std::to_string(std::stoi(ep.substr(colon + 1)) + 1);
  } catch (const std::exception&) {
    throw std::runtime_error("events endpoint '" + ep + "': the port must be a number");
  }
}

// The value of an unlabelled-or-labelled sample `name` in Prometheus text
// (the first one), 0 when absent.
double sample(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, name.size(), name) != 0) continue;
    if (line.size() <= name.size() || (line[name.size()] != ' ' && line[name.size()] != '{')) continue;
    try {
      return std::stod(line.substr(line.rfind(' ') + 1));
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 0;
}

std::optional<ModelInfo> health(const HostPort& hp, std::string* why) {
  const auto r = http_get(hp, "/health", kHealthTimeoutS, why);
  if (!r) return std::nullopt;
  if (r->status != 200) {
    *why = "/health answered " + std::to_string(r->status);
    return std::nullopt;
  }
  try {
    const auto j = nlohmann::json::parse(r->body);
    ModelInfo m;
    m.model = j.value("model", "");
    m.identity = j.value("model_identity", "");
    m.block_size = j.value("block_size", 0);
    m.prefix_protocol = j.value("prefix_key_protocol", "");
    m.vocab = j.value("vocab_fingerprint", "");
    m.chat_template = j.value("chat_template_fingerprint", "");
    m.kv_listen = j.value("kv_listen", "");
    if (j.contains("decode_peers") && j["decode_peers"].is_array())
      for (const auto& p : j["decode_peers"])
        if (p.is_string()) m.decode_peers.push_back(p.get<std::string>());
    if (m.identity.empty() || m.block_size <= 0) {
      *why = "/health names no model_identity and block_size (not a kvserve worker?)";
      return std::nullopt;
    }
    if (m.prefix_protocol != prefix_key_protocol()) {
      // Keys computed otherwise would never match this router's: every
      // cache-aware choice would be a silent miss.
      *why = "its prefix keys are not this router's (worker '" +
             (m.prefix_protocol.empty() ? std::string("none reported") : m.prefix_protocol) + "', router '" +
             prefix_key_protocol() + "'): run the same kvserve version";
      return std::nullopt;
    }
    return m;
  } catch (const std::exception&) {
    *why = "/health is not JSON";
    return std::nullopt;
  }
}

}  // namespace

WorkerSpec parse_worker_spec(const std::string& s) {
  const auto parts = split(s, ',');
  if (parts.empty() || parts.size() > 3) throw std::runtime_error("--worker '" + s + "': expected URL[,EVENTS[,REPLAY]]");
  WorkerSpec w;
  w.url = parts[0];
  w.http = parse_http_url(parts[0]);
  if (parts.size() > 1) {
    w.events = parts[1];
    w.replay = parts.size() > 2 ? parts[2] : next_port(parts[1]);
  }
  return w;
}

WorkerSet::WorkerSet(std::vector<WorkerSpec> specs) : specs_(std::move(specs)), st_(specs_.size()) {}

WorkerSet::~WorkerSet() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

ModelInfo WorkerSet::probe_all(double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::optional<ModelInfo>> got(specs_.size());
  std::vector<std::string> why(specs_.size());
  for (;;) {
    for (size_t i = 0; i < specs_.size(); ++i)
      if (!got[i]) got[i] = health(specs_[i].http, &why[i]);
    // Serving starts with the first usable worker: waiting for the rest
    // (the whole timeout when one is dead) was an outage of its own. The
    // health thread lets the others in as they come.
    bool all = true, any = false, usable = false;
    for (const auto& g : got) {
      any = any || g.has_value();
      all = all && g.has_value();
      usable = usable || (g && vocab_refusal(*g).empty());
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (usable || all || (any && waited >= timeout_s)) break;
    if (waited >= timeout_s) {
      std::string msg = "no worker answered /health within " + std::to_string(int(timeout_s)) + " s:";
      for (size_t i = 0; i < specs_.size(); ++i) msg += " " + specs_[i].url + " (" + why[i] + ")";
      throw std::runtime_error(msg);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  accept_first(got, why);
  return model_;
}

void WorkerSet::accept_first(const std::vector<std::optional<ModelInfo>>& got, std::vector<std::string>& why) {
  // The first worker of the router's vocabulary sets the model the others
  // must serve; one of another vocabulary is left out, not fatal, unless
  // none is left.
  std::optional<size_t> first;
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (!got[i]) continue;
    const std::string r = vocab_refusal(*got[i]);
    if (!r.empty()) {
      why[i] = r;
      continue;
    }
    if (!first) {
      first = i;
      model_ = *got[i];
    }
  }
  if (!first) {
    std::string msg = "no worker can be routed:";
    for (size_t i = 0; i < specs_.size(); ++i) msg += " " + specs_[i].url + " (" + why[i] + ")";
    throw std::runtime_error(msg);
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    State roles = got[i] && why[i].empty() ? roles_of(int(i), *got[i]) : State{};
    std::lock_guard lk(mu_);
    if (!got[i] || !why[i].empty()) {
      st_[i].down_reason = why[i];
      std::fprintf(stderr, "kvserve router: worker %s is down: %s%s\n", specs_[i].url.c_str(), why[i].c_str(),
                   got[i] ? "" : " (it joins when its health check passes)");
      continue;
    }
    if (got[i]->identity != model_.identity || got[i]->block_size != model_.block_size)
      throw std::runtime_error("worker " + specs_[i].url + " " + refusal(*got[i]) + " (the first worker, " +
                               specs_[*first].url + ", serves it)");
    st_[i].up = true;
    st_[i].down_reason.clear();
    set_roles(st_[i], std::move(roles));
  }
}

std::string WorkerSet::vocab_refusal(const ModelInfo& m) const {
  auto fp = [](const std::string& v) { return v.substr(0, 22); };  // the kind + 13 hex digits
  if (!vocab_.empty() && !m.vocab.empty() && m.vocab != vocab_)
    return "its vocabulary is not the router's -m's (worker model '" + m.model + "', " + fp(m.vocab) +
           "; router -m " + model_file_ + ", " + fp(vocab_) +
           "): prompts would be tokenized otherwise and every cache prediction would miss; give the router the "
           "workers' GGUF (a vocab-only copy works)";
  if (!chat_.empty() && !m.chat_template.empty() && m.chat_template != chat_)
    return "its chat template is not the router's (worker " + fp(m.chat_template) + "; router " + chat_desc_ + ", " +
           fp(chat_) +
           "): chat prompts would be rendered otherwise and every chat cache prediction would miss; give the "
           "router the workers' --chat-template (each worker logs its template at start: 'kvserve: chat template: "
           "...')";
  return "";
}

std::string WorkerSet::refusal(const ModelInfo& m) const {
  if (std::string r = vocab_refusal(m); !r.empty()) return r;
  if (!model_.identity.empty() && (m.identity != model_.identity || m.block_size != model_.block_size))
    return "serves another model ('" + m.model + "', identity " + m.identity.substr(0, 12) + ", block size " +
           std::to_string(m.block_size) + ") than the router ('" + model_.model + "', identity " +
           model_.identity.substr(0, 12) + ", block size " + std::to_string(model_.block_size) +
           "); a router serves one model: restart it with the same -m and --block-size";
  return "";
}

void WorkerSet::expect_vocab(std::string fingerprint, std::string model_file) {
  vocab_ = std::move(fingerprint);
  model_file_ = std::move(model_file);
}

void WorkerSet::expect_chat_template(std::string fingerprint, std::string description) {
  chat_ = std::move(fingerprint);
  chat_desc_ = std::move(description);
}

void WorkerSet::start(double interval_s, std::function<void(int)> on_up, std::function<void(int)> on_down) {
  on_up_ = std::move(on_up);
  on_down_ = std::move(on_down);
  thread_ = std::thread([this, interval_s] {
    while (!stop_) {
      for (int i = 0; i < size() && !stop_; ++i) check(i);
      for (double t = 0; t < interval_s && !stop_; t += 0.05)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
}

void WorkerSet::check(int i) {
  std::string why;
  const auto m = health(specs_[size_t(i)].http, &why);
  if (!m) return set_up(i, false, why);
  if (const std::string r = refusal(*m); !r.empty()) return set_up(i, false, r);
  std::string err;
  const auto metrics = http_get(specs_[size_t(i)].http, "/metrics", 2.0, &err);
  State roles = roles_of(i, *m);
  {
    std::lock_guard lk(mu_);
    if (metrics && metrics->status == 200) {
      st_[size_t(i)].waiting = sample(metrics->body, "vllm:num_requests_waiting");
      st_[size_t(i)].running = sample(metrics->body, "vllm:num_requests_running");
      State& s = st_[size_t(i)];
      s.kv_total = sample(metrics->body, "kvserve_kv_blocks_total");
      s.kv_free = sample(metrics->body, "kvserve_kv_blocks_free");
      s.kv_used = sample(metrics->body, "kvserve_kv_blocks_used");
      s.kv_cached = sample(metrics->body, "kvserve_kv_blocks_cached");
    }
    set_roles(st_[size_t(i)], std::move(roles));
  }
  set_up(i, true, "");
}

WorkerSet::State WorkerSet::roles_of(int i, const ModelInfo& m) const {
  State s;
  s.kv_listen = m.kv_listen;
  s.decode_peers = m.decode_peers;
  // A decode worker listening on every address is reached at the host its
  // HTTP URL names.
  const size_t colon = s.kv_listen.rfind(':');
  if (colon != std::string::npos) {
    const std::string host = s.kv_listen.substr(0, colon);
    if (host == "0.0.0.0" || host == "::" || host == "[::]")
      s.kv_listen = specs_[size_t(i)].http.host + s.kv_listen.substr(colon);
  }
  if (!s.kv_listen.empty()) s.kv_listen_addrs = resolve_peer(s.kv_listen);
  for (const std::string& p : s.decode_peers) s.decode_peer_addrs.push_back(resolve_peer(p));
  return s;
}

void WorkerSet::set_roles(State& s, State roles) {
  s.kv_listen = std::move(roles.kv_listen);
  s.decode_peers = std::move(roles.decode_peers);
  s.kv_listen_addrs = std::move(roles.kv_listen_addrs);
  s.decode_peer_addrs = std::move(roles.decode_peer_addrs);
}

void WorkerSet::set_up(int i, bool up, const std::string& reason) {
  bool changed, new_reason;
  {
    std::lock_guard lk(mu_);
    State& s = st_[size_t(i)];
    changed = s.up != up;
    // A worker that stays down for another reason (it came up serving
    // another model, say) says so once: an operator sees why it gets nothing.
    new_reason = !up && s.down_reason != reason;
    if (changed && !up) ++s.downs;
    s.up = up;
    s.down_reason = reason;
  }
  if (changed || new_reason)
    std::fprintf(stderr, "kvserve router: worker %s is %s%s%s\n", specs_[size_t(i)].url.c_str(),
                 up ? "up" : "down", up ? "" : ": ", reason.c_str());
  if (!changed) return;
  if (up && on_up_) on_up_(i);
  if (!up && on_down_) on_down_(i);
}

void WorkerSet::mark_down(int i, const std::string& reason) { set_up(i, false, reason); }

uint64_t WorkerSet::downs(int i) const {
  std::lock_guard lk(mu_);
  return st_[size_t(i)].downs;
}

std::vector<WorkerView> WorkerSet::snapshot() const {
  std::lock_guard lk(mu_);
  std::vector<WorkerView> v;
  for (const State& s : st_)
    v.push_back({s.up, s.waiting + s.running + double(s.inflight), s.inflight, s.down_reason, s.waiting, s.running,
                 s.kv_total, s.kv_free, s.kv_used, s.kv_cached, s.kv_listen, s.decode_peers, s.kv_listen_addrs,
                 s.decode_peer_addrs});
  return v;
}

void WorkerSet::begin_request(int i) {
  std::lock_guard lk(mu_);
  ++st_[size_t(i)].inflight;
}

void WorkerSet::end_request(int i) {
  std::lock_guard lk(mu_);
  --st_[size_t(i)].inflight;
}

std::string WorkerSet::metrics_text() const {
  const auto v = snapshot();
  std::string o = "# HELP kvserve_router_worker_up 1 when the worker is routable.\n# TYPE kvserve_router_worker_up gauge\n";
  for (int i = 0; i < size(); ++i)
    o += "kvserve_router_worker_up{worker=\"" + specs_[size_t(i)].url + "\"} " + (v[size_t(i)].up ? "1" : "0") + "\n";
  o += "# HELP kvserve_router_worker_load Waiting + running (last /metrics) + in flight from the router.\n"
       "# TYPE kvserve_router_worker_load gauge\n";
  for (int i = 0; i < size(); ++i) {
    char b[64];
    std::snprintf(b, sizeof b, "%g", v[size_t(i)].load);
    o += "kvserve_router_worker_load{worker=\"" + specs_[size_t(i)].url + "\"} " + b + "\n";
  }
  return o;
}

}  // namespace kvs::router
