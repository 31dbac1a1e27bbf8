// `kvserve serve`: the OpenAI-compatible HTTP server (docs/SERVER.md).
// Loads the model, starts the engine loop and the HTTP threads, prints one
// ready line, then waits for SIGTERM/SIGINT and shuts down gracefully: stop
// accepting, let in-flight requests finish within --shutdown-timeout, abort
// the rest (their streams end properly), exit 0.
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/signals.h"
#include "cli/common.h"
#include "cli/on_device.h"
#include "kernels/thread_role.h"
#include "kernels/threadpool.h"
#include "tools/default_model.h"
#include "cli/disagg_args.h"
#include "cli/kv_tier_args.h"
#include "engine/paged_engine.h"
#include "kv/window_policy.h"
#include "model/vocab_fingerprint.h"
#include "events/event_executor.h"
#include "events/event_publisher.h"
#include "sched/executor.h"
#include "sched/clock.h"
#include "sched/engine_loop.h"
#include "server/api_service.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/tenants.h"
#include "tiers/tier_metrics.h"
#include "tools/kv_memory.h"

namespace kvs::cli {

namespace {

struct ServeArgs {
  ModelArgs m;
  std::string host = "127.0.0.1";
  int port = 8080;
  int ctx = 0;
  std::string kv_memory;
  int block_size = 16;
  int max_seqs = 64, max_batch_tokens = 512, max_queue = 256, default_max_tokens = 256;
  double max_request_share = 0.25, kv_headroom = 0.05, interactive_wait_s = 10, batch_wait_s = 300;
  double tenant_share = -1;  // < 0: 0.5 with --api-keys, off without (one anonymous tenant)
  bool no_prefix_cache = false;
  KvArgs kv;
  WindowArgs window;
  std::string api_keys, cache_secret_file, chat_template = "auto", served_model_name;
  // One I/O thread serves thousands of connections; more only help when
  // requests' parsing and tokenizing keep one busy (big machines).
  int http_threads = std::clamp(int(std::thread::hardware_concurrency()) / 4, 1, 4);
  std::string compute_priority = "batch";
  double shutdown_timeout_s = 30, header_timeout_s = 30, body_timeout_s = 60, write_timeout_s = 60;
  std::string body_limit = "8MiB";
  size_t stream_queue = 4096;
  std::string metrics_compat = "vllm";
  std::string dashboard_plots;
  // KV-cache events (docs/SCALE-OUT.md)
  std::string kv_events, kv_events_replay, kv_events_topic, kv_events_curve;
  bool kv_events_tokens = false;
  std::string ram_budget;  // docs/ON-DEVICE.md
  DeviceArgs dev;
  KvTierArgs tiers;  // disk / Redis KV tiers (docs/KV.md)
  DisaggArgs disagg;  // --role and the KV transfer addresses (docs/DISAGG.md)
};

// --ram-budget: the pool, KV type, context, batch and reply length it chose.
void apply_ram_budget(const tools::RamBudgetChoice& c, sched::EngineLoopOptions& lo, int& ctx) {
  lo.cache = {};
  lo.cache.type = c.kv_type;
  lo.cache.key_scale = KeyScale::Channel;
  lo.kv_blocks = c.kv_blocks;
  lo.kv_memory_bytes = 0;
  lo.sched.max_seqs = c.batch;
  lo.sched.max_batch_tokens = c.max_batch_tokens;
  lo.sched.default_max_tokens = c.max_tokens;
  ctx = c.hard_cap;
  lo.max_ctx = ctx;
}

// --ram-budget's choice for this server's flags (nullopt without the flag);
// reads the GGUF header only, so an impossible budget fails before loading.
std::optional<tools::RamBudgetChoice> ram_budget_for(const ServeArgs& a, const std::string& model_path) {
  if (!a.ram_budget.empty() && !a.kv_memory.empty())
    throw std::runtime_error("--ram-budget sizes the KV pool itself; drop --kv-memory");
  tools::RamBudgetInput rin;
  rin.block_size = a.block_size;
  rin.want_ctx = a.ctx;
  rin.want_batch = a.max_seqs;
  rin.max_batch_tokens = a.max_batch_tokens;
  rin.max_tokens = a.default_max_tokens;
  return ram_budget_choice(a.ram_budget, model_path, rin);
}

// The KV pool: from --ram-budget, --kv-memory, or by default enough for
// --max-seqs full contexts within a share of the memory available now.
void size_kv_pool(const ServeArgs& a, const Engine& engine, const std::optional<tools::RamBudgetChoice>& budget,
                  sched::EngineLoopOptions& lo, int& ctx) {
  if (budget) {
    apply_ram_budget(*budget, lo, ctx);
  } else if (!a.kv_memory.empty()) {
    lo.kv_memory_bytes = tools::parse_kv_memory(a.kv_memory);
  } else {
    // Default: enough for --max-seqs full contexts, at most 20% of the
    // memory available now.
    // A bounding window caps what one sequence holds (KvManager::live_cap),
    // per KV table.
    const WindowPolicy w = lo.window.resolve(engine.model().config().sliding_window);
    const KvLayout layout = kv_layout_for(engine, a.block_size, lo.cache);
    const int64_t per_seq = sequence_block_cap(table_windows(w, layout.groups), ctx, a.block_size, a.max_batch_tokens);
    const int64_t want = int64_t(a.max_seqs) * per_seq + 1;
    const int64_t fit = kv_blocks_for_budget(engine, a.block_size, tools::parse_kv_memory("20%"), lo.cache);
    lo.kv_blocks = std::max<int64_t>(1, std::min(want, fit));
  }
}

// Waits for SIGTERM/SIGINT; meanwhile polls the device monitor (if any) and
// hands its plan to the engine loop and the compute pool. Returns the signal.
int wait_for_signal(const sigset_t& sigs, device::DeviceMonitor* monitor, double hold_s, sched::EngineLoop& loop,
                    Engine& engine) {
  const int all = engine.n_threads();
  for (;;) {
    if (!monitor) {
      int sig = 0;
      sigwait(&sigs, &sig);
      return sig;
    }
    const timespec tick{0, 250'000'000};
    const int sig = sigtimedwait(&sigs, nullptr, &tick);
    if (sig > 0) return sig;
    monitor->poll(sched::steady_now(), [&](const device::DeviceState& st) {
      const sched::ShedLimits want = shed_limits_for(st.plan, all, hold_s);
      if (want == loop.shed_limits()) return;
      loop.set_shed_limits(want);
      engine.pool().set_active_threads(want.threads > 0 ? want.threads : all);
    });
  }
}

// The replay endpoint next to the PUB one: the next port (or any port when
// the PUB port is a wildcard).
std::string default_replay_endpoint(const std::string& pub) {
  const size_t colon = pub.rfind(':');
  if (colon == std::string::npos || pub.compare(0, 6, "tcp://") != 0)
    throw std::runtime_error("--kv-events '" + pub + "': expected tcp://HOST:PORT");
  const std::string port = pub.substr(colon + 1);
  if (port == "*") return pub;
  try {
    const int p = std::stoi(port);
    if (p < 1 || p >= 65535) throw std::out_of_range("port");
    return pub.substr(0, colon + 1) + std::to_string(p + 1);
  } catch (const std::exception&) {
    throw std::runtime_error("--kv-events '" + pub + "': the port must be a number below 65535 or *");
  }
}

// The engine loop; with a publisher, over the executor that feeds it events.
// With tiers, the pool offers its keyed blocks to them and loads from them.
// `paged` is the pool's executor, for the disaggregation roles.
std::unique_ptr<sched::EngineLoop> start_loop(Engine& engine, const Tokenizer* tok, const sched::EngineLoopOptions& lo,
                                              events::EventPublisher* publisher, KvTierPort* tier, const ServeArgs& a,
                                              sched::PagedExecutor*& paged) {
  auto pe = sched::paged_executor(engine, lo);
  paged = pe.get();
  if (tier) pe->paged().set_tier(tier);
  if (!publisher) return std::make_unique<sched::EngineLoop>(std::move(pe), tok, lo);
  return std::make_unique<sched::EngineLoop>(
      std::make_unique<events::EventingExecutor>(std::move(pe), *publisher, a.kv_events_tokens), tok, lo);
}

std::unique_ptr<events::EventPublisher> start_publisher(const ServeArgs& a) {
  if (a.kv_events.empty()) return nullptr;
  events::PublisherOptions po;
  po.endpoint = a.kv_events;
  po.replay_endpoint = a.kv_events_replay.empty() ? default_replay_endpoint(a.kv_events) : a.kv_events_replay;
  po.topic = a.kv_events_topic;
  po.block_size = a.block_size;
  if (!a.kv_events_curve.empty()) po.curve = events::read_curve_keyfile(a.kv_events_curve, events::CurveEnd::Worker);
  return std::make_unique<events::EventPublisher>(po);
}

std::vector<uint8_t> read_secret(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("--cache-secret-file: cannot open " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// /v1/models "created": the model file's modification time, else now (the
// load time).
int64_t model_created(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && st.st_mtime > 0) return int64_t(st.st_mtime);
  return int64_t(std::time(nullptr));
}

size_t parse_body_limit(const std::string& s) {
  // Same grammar as sizes elsewhere ("8MiB"); plain digits are bytes.
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0) throw std::runtime_error("--body-limit '" + s + "': expected a size like 8MiB or 1048576");
  const uint64_t v = std::stoull(s.substr(0, i));
  const std::string u = s.substr(i);
  const uint64_t mul = u.empty() || u == "B" ? 1 : u == "KiB" ? 1024 : u == "MiB" ? 1 << 20 : u == "GiB" ? 1 << 30 : 0;
  if (mul == 0) throw std::runtime_error("--body-limit '" + s + "': units are B, KiB, MiB, GiB");
  return size_t(v * mul);
}

sched::EngineLoopOptions loop_options(const ServeArgs& a, int ctx) {
  sched::EngineLoopOptions lo;
  lo.sched.max_batch_tokens = a.max_batch_tokens;
  lo.sched.max_seqs = a.max_seqs;
  lo.sched.max_queue = a.max_queue;
  lo.sched.max_request_share = a.max_request_share;
  // Without keys every request is the one anonymous tenant: a per-tenant cap
  // would only leave part of the pool unused.
  lo.sched.tenant_quota_share = a.tenant_share >= 0 ? a.tenant_share : (a.api_keys.empty() ? 1.0 : 0.5);
  lo.sched.kv_headroom = a.kv_headroom;
  lo.sched.default_max_tokens = a.default_max_tokens;
  lo.sched.wait_limit_s = {a.interactive_wait_s, a.batch_wait_s};
  lo.block_size = a.block_size;
  lo.max_ctx = ctx;
  lo.prefix_caching = !a.no_prefix_cache;
  lo.cache = a.kv.options();
  lo.window = a.window.policy();
  return lo;
}

// The dashboard's tier and device panels, from the same objects /metrics reads.
void add_dashboard_panels(server::DashboardOptions& d, tiers::TierSet* tierset, device::DeviceMonitor* monitor) {
  if (monitor)
    d.device_json = [monitor] {
      const device::DeviceState st = monitor->state();
      return nlohmann::json{{"level", device::to_string(st.level)}, {"causes", device::causes_to_string(st.causes)},
                            {"state", st.describe()}, {"transitions", st.transitions}}
          .dump();
    };
  if (tierset)
    d.tiers_json = [tierset] {
      nlohmann::json arr = nlohmann::json::array();
      for (const tiers::TierCounters& c : tierset->stats().tiers)
        arr.push_back({{"tier", c.tier}, {"hits", c.hits}, {"misses", c.misses}, {"stores", c.stores},
                       {"evictions", c.evictions}, {"errors", c.errors}, {"bytes", c.bytes}, {"available", c.available}});
      return arr.dump();
    };
}

// The lines after "listening on" for the features that are on.
void print_features(const ServeArgs& a, const DisaggRoles& roles, const events::EventPublisher* publisher, bool tiers) {
  if (a.disagg.role != "both") std::printf("kvserve: %s\n", roles.describe().c_str());
  if (publisher)
    std::printf("kvserve: kv events on %s (replay %s, topic '%s', token ids %s%s)\n", publisher->endpoint().c_str(),
                publisher->replay_endpoint().c_str(), a.kv_events_topic.c_str(), a.kv_events_tokens ? "on" : "off",
                a.kv_events_curve.empty() ? "" : ", CURVE");
  if (tiers)
    std::printf("kvserve: kv tiers:%s%s (retention %.0f s, encrypted)\n",
                a.tiers.disk_dir.empty() ? "" : (" disk " + a.tiers.disk_dir + " (" + a.tiers.disk_size + ")").c_str(),
                a.tiers.redis_url.empty() ? "" : (" redis " + tiers::redis_url_for_logs(a.tiers.redis_url)).c_str(), a.tiers.retention_s);
  std::fflush(stdout);
}

// Stop accepting, let in-flight requests finish within the timeout, abort
// the rest (their streams still get their final chunk), stop the HTTP threads.
void drain_and_stop(double timeout_s, server::ApiService& api, server::HttpServer& http, sched::EngineLoop& loop) {
  api.set_draining(true);
  http.stop_accepting();
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  while (clock::now() < deadline) {
    const sched::MetricsSnapshot m = loop.metrics();
    if (m.running_requests == 0 && m.queued[0] + m.queued[1] == 0 && http.active_requests() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  loop.shutdown();
  const auto flush_deadline = clock::now() + std::chrono::seconds(2);
  while (http.active_requests() > 0 && clock::now() < flush_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http.stop();
  std::fprintf(stderr, "kvserve: stopped\n");
}

server::ApiOptions api_options(const ServeArgs& a, const Model& model, int ctx, int default_max_tokens,
                               server::ChatTemplate chat) {
  server::ApiOptions ao;
  const std::filesystem::path mp(model.path());
  ao.model_id = a.served_model_name.empty() ? mp.stem().string() : a.served_model_name;
  // "default": what loadgen.py and some clients send when no model is named.
  ao.model_aliases = {mp.filename().string(), model.path(), mp.stem().string(), "default"};
  ao.model_identity = model.identity();
  ao.ctx = ctx;
  ao.default_max_tokens = default_max_tokens;
  ao.chat = std::move(chat);
  ao.stream_queue_events = a.stream_queue;
  ao.model_created = model_created(model.path());
  ao.metrics_vllm = a.metrics_compat == "vllm";
  return ao;
}

// What /health says of this worker's model beside its roles.
void add_identity_fields(server::ApiOptions& ao, const Model& m) {
  // How float-weight products run (kernels/matmul.h): a router or operator
  // sees why two workers of one file have different identities.
  ao.health_extra["matmul_precision"] = m.bf16_matmuls() ? "bf16" : "fp32";
  ao.health_extra["attention_precision"] = m.bf16_attention() ? "bf16" : "fp32";
  // A router checks its own -m against this (it tokenizes prompts itself).
  ao.health_extra["vocab_fingerprint"] = vocab_fingerprint(m.vocab());
  // And its chat template against this one (it renders chat prompts itself).
  ao.health_extra["chat_template_fingerprint"] = ao.chat.fingerprint();
}

server::HttpOptions http_options(const ServeArgs& a, size_t body_limit) {
  server::HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.threads = a.http_threads;
  ho.body_limit = body_limit;
  ho.header_timeout_s = a.header_timeout_s;
  ho.body_timeout_s = a.body_timeout_s;
  ho.write_timeout_s = a.write_timeout_s;
  return ho;
}

int run_serve(const ServeArgs& a) {
  const sigset_t sigs = block_signals();
  // Before the engine's pool exists: its threads take the priority at start.
  set_compute_priority(a.compute_priority == "idle" ? ComputePriority::Idle : ComputePriority::Batch);

  // Everything that can be wrong with the flags fails before the model loads.
  std::unique_ptr<server::TenantRegistry> tenants =
      a.api_keys.empty() ? std::make_unique<server::TenantRegistry>() : server::TenantRegistry::from_file(a.api_keys);
  if (!a.cache_secret_file.empty()) tenants->set_secret(read_secret(a.cache_secret_file));
  const std::optional<crypto::SecretKey> tier_key = tier_master_key(a.tiers, !a.no_prefix_cache);
  // Tier entries are keyed by scope: scopes must be the same after a restart
  // and on every replica sharing the tier, so their secret comes from the key.
  if (tier_key && a.cache_secret_file.empty()) tenants->set_secret(tier_scope_secret(*tier_key));
  const size_t body_limit = parse_body_limit(a.body_limit);
  check_disagg_args(a.disagg, !a.cache_secret_file.empty() || tier_key.has_value());
  set_ucx_defaults(a.disagg);

  ModelArgs margs = a.m;
  margs.model = resolve_model_path(a.m.model);
  const std::optional<tools::RamBudgetChoice> budget = ram_budget_for(a, margs.model);
  Loaded l = load_all(margs, a.ctx);
  std::string note;
  server::ChatTemplate chat = server::ChatTemplate::choose(a.chat_template, l.model->vocab(), &note);
  std::fprintf(stderr, "kvserve: %s\n", note.c_str());
  const int n_ctx_model = l.model->config().n_ctx_train;
  int ctx = a.ctx > 0 ? a.ctx : n_ctx_model;
  if (ctx <= 1) throw std::runtime_error("the context size is unknown; pass --ctx");

  sched::EngineLoopOptions lo = loop_options(a, ctx);
  size_kv_pool(a, *l.engine, budget, lo, ctx);
  // The publisher binds before the model serves, so a taken port fails now.
  std::unique_ptr<events::EventPublisher> publisher = start_publisher(a);
  const KvLayout layout = kv_layout_for(*l.engine, a.block_size, lo.cache);
  std::unique_ptr<tiers::TierSet> tierset =
      tier_key ? start_tiers(a.tiers, *tier_key, l.model->identity(), layout, tenants->longest_retention()) : nullptr;
  sched::PagedExecutor* paged = nullptr;
  const std::unique_ptr<sched::EngineLoop> loop_ptr =
      start_loop(*l.engine, l.tok.get(), lo, publisher.get(), tierset.get(), a, paged);
  sched::EngineLoop& loop = *loop_ptr;
  const DisaggRoles roles = start_roles(a.disagg, *paged, loop);

  server::ApiOptions ao = api_options(a, *l.model, ctx, lo.sched.default_max_tokens, std::move(chat));
  const std::unique_ptr<device::DeviceMonitor> monitor = make_device_monitor(a.dev);
  ao.extra_metrics = [p = publisher.get(), t = tierset.get(), &roles, d = monitor.get()] {
    return (p ? p->metrics_text() : std::string()) + (t ? tiers::metrics_text(t->stats()) : std::string()) +
           roles.metrics_text() + (d ? d->metrics_text() : std::string());
  };
  if (roles.prefill) {
    ao.hand_off_sink = [pr = roles.prefill.get()](sched::EventSink next, const Scope& scope, int peer) {
      return pr->wrap(std::move(next), scope, peer);
    };
    ao.decode_peer_index = [pr = roles.prefill.get()](const std::string& p) { return pr->peer_index(p); };
  }
  ao.health_extra = roles.health_fields();
  add_identity_fields(ao, *l.model);
  ao.accept_handover = roles.decode != nullptr;
  if (roles.decode) ao.await_handover = [d = roles.decode.get()](uint64_t h) { return d->await_claim(h); };
  ao.plots_dir = a.dashboard_plots;
  add_dashboard_panels(ao.dashboard_opts, tierset.get(), monitor.get());
  server::ApiService api(loop, *l.tok, *tenants, ao);

  server::HttpServer http(api, http_options(a, body_limit));
  http.start();
  api.set_ready(true);
  std::printf("kvserve: listening on http://%s:%d (model %s, ctx %d, %lld KV blocks of %d tokens, KV %s, window %s, %s)\n",
              a.host.c_str(), http.port(), ao.model_id.c_str(), ctx, static_cast<long long>(loop.kv_blocks_total()),
              loop.block_size(), layout.describe().c_str(),
              lo.window.resolve(l.model->config().sliding_window).describe().c_str(),
              tenants->auth_required() ? "API keys required" : "no auth");
  print_features(a, roles, publisher.get(), tierset != nullptr);

  const int sig = wait_for_signal(sigs, monitor.get(), a.dev.hold_s, loop, *l.engine);
  std::fprintf(stderr, "kvserve: %s: draining (up to %.0f s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               a.shutdown_timeout_s);
  drain_and_stop(a.shutdown_timeout_s, api, http, loop);
  return 0;
}

// --ram-budget chooses the KV format itself (apply_ram_budget): a format
// given beside it would be replaced without a word, so it is refused.
void refuse_kv_format_beside_budget(const CLI::App& c, const ServeArgs& a) {
  if (a.ram_budget.empty()) return;
  for (const char* o : {"--kv-type", "--kv-key-scale", "--kv-residual", "--kv-group"})
    if (c.get_option(o)->count() > 0)
      throw CLI::ValidationError(std::string(o), "--ram-budget chooses the KV format itself; drop " + std::string(o) +
                                                     ", or drop --ram-budget and size the pool with --kv-memory");
}

// The pool and the scheduler: context, KV memory and blocks, batch, queue and shares.
void add_pool_args(CLI::App* c, ServeArgs& a) {
  c->add_option("-c,--ctx", a.ctx, "Context window per request (default: the model's)")->check(CLI::Range(0, 1 << 22));
  c->add_option("--kv-memory", a.kv_memory,
                "KV pool size (2GiB) or share of available RAM (40%) (default: --max-seqs full contexts, at most 20%)");
  c->add_option("--block-size", a.block_size, "Tokens per KV block")->capture_default_str()->check(CLI::Range(8, 256));
  c->add_option("--max-seqs", a.max_seqs, "Sequences running at once")->capture_default_str()->check(CLI::Range(1, 4096));
  c->add_option("--max-batch-tokens", a.max_batch_tokens, "Tokens through the model per step")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  c->add_option("--max-queue", a.max_queue, "Requests that may wait past the next engine step before 429 (0: admit at the next step or 429)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  c->add_option("--max-request-share", a.max_request_share, "Largest share of the KV pool one request may need")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  c->add_option("--tenant-share", a.tenant_share,
                "Largest share of the KV pool one tenant's running + queued requests may need "
                "(>= 1: off; default 0.5 with --api-keys, off without)")
      ->check(CLI::Range(-1.0, 1e9));
  c->add_option("--kv-headroom", a.kv_headroom, "Share of the KV pool never promised")
      ->capture_default_str()->check(CLI::Range(0.0, 0.9));
  c->add_option("--interactive-wait", a.interactive_wait_s, "Seconds an interactive request may wait before 429")
      ->capture_default_str();
  c->add_option("--batch-wait", a.batch_wait_s, "Seconds a batch request may wait before 429")->capture_default_str();
  c->add_option("--default-max-tokens", a.default_max_tokens, "max_tokens when a request names none")
      ->capture_default_str()->check(CLI::Range(1, 1 << 24));
  c->add_flag("--no-prefix-cache", a.no_prefix_cache, "Do not reuse K/V of equal prompt prefixes");
}

// The HTTP front: its threads, priority, timeouts and limits.
void add_http_args(CLI::App* c, ServeArgs& a) {
  c->add_option("--http-threads", a.http_threads, "HTTP I/O threads (default: a quarter of the CPUs, 1 to 4)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  c->add_option("--compute-priority", a.compute_priority,
                "batch: compute threads share the CPU like any process; idle: every other thread (HTTP, "
                "clients, scrapers on this machine) preempts them at once -- for a machine that only serves "
                "(docs/SERVER.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"batch", "idle"}));
  c->add_option("--shutdown-timeout", a.shutdown_timeout_s, "Seconds to finish in-flight requests on SIGTERM")
      ->capture_default_str();
  c->add_option("--header-timeout", a.header_timeout_s, "Seconds for an idle connection / request head")
      ->capture_default_str();
  c->add_option("--body-timeout", a.body_timeout_s, "Seconds for a request body")->capture_default_str();
  c->add_option("--write-timeout", a.write_timeout_s, "Seconds a client may stall a write before it is cut off")
      ->capture_default_str();
  c->add_option("--body-limit", a.body_limit, "Largest request body (larger: 413)")->capture_default_str();
  c->add_option("--stream-buffer", a.stream_queue, "Events buffered per request before a slow client is cut off")
      ->capture_default_str()->check(CLI::Range(16, 1 << 20));
}

// KV-cache events for routers (vLLM's format over ZeroMQ).
void add_event_args(CLI::App* c, ServeArgs& a) {
  c->add_option("--kv-events", a.kv_events,
                "Publish KV-cache events in vLLM's format on this ZeroMQ PUB endpoint (tcp://HOST:PORT, port * = any)");
  c->add_option("--kv-events-replay", a.kv_events_replay,
                "Replay (ROUTER) endpoint for missed event batches (default: the --kv-events port + 1)");
  c->add_option("--kv-events-topic", a.kv_events_topic, "First frame of every event message (default: empty)");
  c->add_flag("--kv-events-tokens", a.kv_events_tokens,
              "Include each stored block's token ids (prompt content) in the events");
  c->add_option("--kv-events-curve", a.kv_events_curve,
                "CURVE key file (public-key/secret-key; client-key lines: the only routers let in) to encrypt "
                "the event sockets (docs/SCALE-OUT.md)");
}

}  // namespace

void add_serve(CLI::App& app, Runner& run) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  add_model_args(c, a->m);
  c->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  c->add_option("--port", a->port, "TCP port (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  add_pool_args(c, *a);
  add_kv_args(c, a->kv);
  add_window_args(c, a->window);
  c->add_option("--api-keys", a->api_keys, "JSON file of sha256 key hashes -> tenants (default: no auth)");
  c->add_option("--cache-secret-file", a->cache_secret_file,
                "Secret for prefix-cache scopes (default: random per process)");
  c->add_option("--chat-template", a->chat_template,
                "auto (the model's own template), llama2, llama3, chatml, mistral, plain, a template the model file names "
                "(tokenizer.chat_template.NAME) or a Jinja file")
      ->capture_default_str();
  c->add_option("--served-model-name", a->served_model_name, "Model id for clients (default: the file's stem)");
  add_http_args(c, *a);
  add_event_args(c, *a);
  c->add_option("--ram-budget", a->ram_budget,
                "Memory for weights + KV + scratch (e.g. 1GiB): picks the KV type, pool, context, batch and max tokens");
  // Off by default: a shared server's shedding is an operator's choice.
  add_device_args(c, a->dev, false);
  add_kv_tier_args(c, a->tiers);
  add_disagg_args(c, a->disagg);
  c->add_option("--dashboard-plots", a->dashboard_plots,
                "Folder of SVG plots (eval/plan/bench --svg) linked from GET /dashboard");
  c->add_option("--metrics-compat", a->metrics_compat,
                "Extra /metrics names: vllm (the vllm:* names gateways read) or none")
      ->capture_default_str()->check(CLI::IsMember({"vllm", "none"}));
  c->callback([a, c, &run] {
    refuse_kv_format_beside_budget(*c, *a);
    run = [a] { return run_serve(*a); };
  });
}

}  // namespace kvs::cli
