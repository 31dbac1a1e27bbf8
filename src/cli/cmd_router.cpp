// `kvserve router`: an OpenAI-compatible front for several `kvserve serve`
// workers with cache-aware routing from their KV-cache events, and failover
// (docs/SCALE-OUT.md). Reads only the model's vocabulary (a vocab-only GGUF
// works); the model identity and block size come from the workers.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "cli/commands.h"
#include "cli/signals.h"
#include "events/curve_keys.h"
#include "model/gguf.h"
#include "model/vocab_fingerprint.h"
#include "model/vocab_loaders.h"
#include "router/event_listener.h"
#include "router/pd_choice.h"
#include "router/prefix_index.h"
#include "router/request_hasher.h"
#include "router/router_server.h"
#include "router/workers.h"
#include "server/chat_template.h"
#include "server/tenants.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace kvs::cli {

namespace {

struct RouterArgs {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> workers;
  std::vector<std::string> prefill_workers, decode_workers;  // docs/DISAGG.md
  std::string model, api_keys, secret_file, chat_template = "auto", policy = "cache", curve;
  double load_weight = 0.2, health_interval_s = 1, startup_timeout_s = 30, events_stale_s = 10;
  double read_timeout_s = 600;
};

// Said at start: otherwise the first sign of an unusable pairing is every
// request's 503.
void warn_without_pair(const router::WorkerSet& workers, const std::vector<int>& prefill,
                       const std::vector<int>& decode) {
  std::string why;
  if (!router::choose_pd(workers.snapshot(), prefill, decode, 0, &why))
    std::fprintf(stderr, "kvserve router: warning: no prefill/decode pair can serve yet: %s\n", why.c_str());
}

int run_router(const RouterArgs& a) {
  const sigset_t sigs = block_signals();

  std::vector<router::WorkerSpec> specs;
  for (const auto& w : a.workers) specs.push_back(router::parse_worker_spec(w));
  if (a.prefill_workers.empty() != a.decode_workers.empty())
    throw std::runtime_error("disaggregated serving needs at least one --prefill-worker and one --decode-worker");
  if (specs.empty() && a.prefill_workers.empty())
    throw std::runtime_error("give --worker, or --prefill-worker with --decode-worker");
  if (!specs.empty() && !a.prefill_workers.empty())
    throw std::runtime_error("--worker cannot be mixed with --prefill-worker/--decode-worker");
  std::vector<int> prefill, decode;
  for (const std::string& w : a.prefill_workers) {
    prefill.push_back(int(specs.size()));
    specs.push_back(router::parse_worker_spec(w));
  }
  for (const std::string& w : a.decode_workers) {
    decode.push_back(int(specs.size()));
    specs.push_back(router::parse_worker_spec(w));
  }
  if (specs.size() > size_t(router::PrefixIndex::kMaxWorkers))
    throw std::runtime_error("at most " + std::to_string(router::PrefixIndex::kMaxWorkers) + " workers");
  const auto policy = router::parse_policy(a.policy);
  if (!policy) throw std::runtime_error("--policy must be cache, round-robin or least-load");
  std::unique_ptr<server::TenantRegistry> tenants =
      a.api_keys.empty() ? std::make_unique<server::TenantRegistry>() : server::TenantRegistry::from_file(a.api_keys);
  if (!a.secret_file.empty()) {
    std::ifstream f(a.secret_file, std::ios::binary);
    if (!f) throw std::runtime_error("--cluster-secret: cannot open " + a.secret_file);
    tenants->set_secret(std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {}));
  } else if (*policy == router::Policy::Cache) {
    std::fprintf(stderr,
                 "kvserve router: warning: no --cluster-secret: the workers' cache scopes cannot be computed here, "
                 "so the cache policy only sees the router's own placements\n");
  }
  const Vocab vocab = vocab_from_gguf(*GgufFile::open(a.model));
  const std::unique_ptr<Tokenizer> tok = Tokenizer::create(vocab);
  std::string note;
  server::ChatTemplate chat = server::ChatTemplate::choose(a.chat_template, vocab, &note);

  router::WorkerSet workers(specs);
  workers.expect_vocab(vocab_fingerprint(vocab), a.model);
  workers.expect_chat_template(chat.fingerprint(), chat.description());
  const router::ModelInfo model = workers.probe_all(a.startup_timeout_s);
  router::RequestHasher hasher(*tok, std::move(chat), *tenants);
  hasher.set_model(model.identity, model.block_size);
  router::PrefixIndex index;
  std::optional<events::CurveKeys> curve;
  if (!a.curve.empty()) curve = events::read_curve_keyfile(a.curve, events::CurveEnd::Subscriber);
  router::EventListener listener(workers, index, curve, a.events_stale_s);
  listener.start();
  workers.start(a.health_interval_s, [&](int i) { listener.reset(i); }, [&](int i) { listener.reset(i); });

  router::RouterOptions ro;
  ro.host = a.host;
  ro.port = a.port;
  ro.policy = *policy;
  ro.load_weight = a.load_weight;
  ro.read_timeout_s = a.read_timeout_s;
  ro.health_interval_s = a.health_interval_s;
  ro.prefill_workers = prefill;
  ro.decode_workers = decode;
  if (!prefill.empty()) warn_without_pair(workers, prefill, decode);
  router::RouterServer srv(workers, index, listener, hasher, ro);
  srv.start();
  int up = 0;
  for (const auto& v : workers.snapshot()) up += v.up;
  std::printf("kvserve router: listening on http://%s:%d (%d workers, %d up, policy %s, model %s, block size %d, %s)\n",
              a.host.c_str(), srv.port(), workers.size(), up,
              prefill.empty() ? router::to_string(*policy) : "prefill/decode, pairs chosen per request", model.model.c_str(),
              model.block_size, note.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "kvserve router: %s: stopping\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  srv.stop();
  return 0;
}

}  // namespace

void add_router(CLI::App& app, Runner& run) {
  auto a = std::make_shared<RouterArgs>();
  CLI::App* c = app.add_subcommand("router", "OpenAI-compatible router over kvserve workers (cache-aware, failover)");
  c->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  c->add_option("--port", a->port, "TCP port (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  c->add_option("--worker", a->workers,
                "A worker: URL[,EVENTS[,REPLAY]] (http://HOST:PORT, its --kv-events endpoint, its replay endpoint "
                "(default: the events port + 1)); repeat per worker");
  c->add_option("--prefill-worker", a->prefill_workers,
                "Disaggregated serving: a `serve --role prefill` worker's URL; repeat per worker. Each request goes to "
                "the least loaded prefill worker and decode worker whose KV address it lists as --decode-peer");
  c->add_option("--decode-worker", a->decode_workers, "Disaggregated serving: a `serve --role decode` worker's URL; repeat per worker");
  c->add_option("-m,--model", a->model, "The workers' model GGUF (only its vocabulary is read)")->required();
  c->add_option("--api-keys", a->api_keys, "The workers' --api-keys file (scopes are per tenant)");
  c->add_option("--cluster-secret,--cache-secret-file", a->secret_file, "The workers' --cache-secret-file");
  c->add_option("--chat-template", a->chat_template,
                "As the workers' --chat-template (a worker rendering chat prompts with another template is left out)")
      ->capture_default_str();
  c->add_option("--policy", a->policy, "cache, round-robin or least-load")
      ->capture_default_str()->check(CLI::IsMember({"cache", "round-robin", "least-load"}));
  c->add_option("--load-weight", a->load_weight,
                "cache policy: cost of one waiting/running request, in prompt-sized prefills")
      ->capture_default_str()->check(CLI::Range(0.0, 100.0));
  c->add_option("--health-interval", a->health_interval_s, "Seconds between /health and /metrics checks")
      ->capture_default_str()->check(CLI::Range(0.05, 3600.0));
  c->add_option("--startup-timeout", a->startup_timeout_s, "Seconds to wait for the first worker at start")
      ->capture_default_str();
  c->add_option("--events-stale", a->events_stale_s,
                "Seconds of event silence while requests are sent before a worker counts as holding nothing")
      ->capture_default_str();
  c->add_option("--kv-events-curve", a->curve,
                "CURVE key file: the router's own public-key/secret-key and the workers' server-key "
                "(docs/SCALE-OUT.md)");
  c->add_option("--read-timeout", a->read_timeout_s,
                "Seconds a worker may stay silent mid-request (one the health check marks down ends sooner: "
                "failed over before its first byte, else ended after 2 s of silence)")
      ->capture_default_str();
  c->callback([a, &run] { run = [a] { return run_router(*a); }; });
}

}  // namespace kvs::cli
