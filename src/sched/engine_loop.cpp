#include "sched/engine_loop.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <unordered_map>

#include "engine/generate.h"
#include "kernels/thread_role.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "sched/clock.h"

namespace kvs::sched {

Histogram Histogram::latency() {
  Histogram h;
  h.bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  h.counts.assign(h.bounds.size() + 1, 0);
  return h;
}

void Histogram::observe(double v) {
  const size_t i = size_t(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
  ++counts[i];
  sum += v;
  ++count;
}

double Histogram::quantile(double q) const {
  if (count == 0) return 0;
  const double want = q * double(count);
  uint64_t acc = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    acc += counts[i];
    if (double(acc) >= want) return i < bounds.size() ? bounds[i] : bounds.back();
  }
  return bounds.back();
}

namespace {

// Text state of one choice: streamed UTF-8 with stop strings held back.
struct ChoiceText {
  std::unique_ptr<Detokenizer> detok;
  std::unique_ptr<StopMatcher> stop;
  double first = -1;
  int tokens = 0;
  bool done = false;
};

struct Live {
  EventSink sink;
  SloClass slo = SloClass::Interactive;
  double submitted = 0, first = -1;
  std::vector<ChoiceText> ch;
  int open = 0;
  int min_tokens = 0;
  bool sink_failed = false;
  // For the engine thread's own books (owner tags, retention sweep).
  Scope scope;
  std::string tenant;
  double retention_s = 0;
};

}  // namespace

struct EngineLoop::Impl {
  EngineLoopOptions opts;
  std::unique_ptr<StepExecutor> exec;
  const Tokenizer* tok = nullptr;
  std::unique_ptr<Scheduler> sched;
  std::atomic<RequestId> next_id{1};

  // The inbox: commands for the engine thread, the stop flag, wake-ups.
  RankedMutex inbox_mu{LockRank::Inbox};
  std::condition_variable_any cv;
  std::vector<PoolCommand> inbox;
  bool stop = false;
  bool exited = false;  // the engine thread takes no more commands: post() answers them
  std::thread th;
  // After a change the engine's wait predicate reads (the scheduler's work)
  // but not under inbox_mu: the empty lock orders the notify after a wait
  // that already checked the predicate, which would otherwise sleep on
  // through this wake-up until its period ends.
  void wake() {
    { std::lock_guard lk(inbox_mu); }
    cv.notify_one();
  }

  // Live requests' sinks and text state: submit() inserts, the engine
  // thread serves; `fresh` names the ones its books have not seen yet.
  RankedMutex live_mu{LockRank::Live};
  std::unordered_map<RequestId, Live> live;
  std::vector<RequestId> fresh;

  // Engine thread only: scopes with a retention TTL, who submitted under
  // each owner tag (pool views), counters it publishes.
  struct Retained {
    Scope scope;
    double retention_s = 0, last_submit = 0;
  };
  std::vector<Retained> retained;
  std::unordered_map<uint32_t, std::string> owner_tenant;
  double next_sweep = 0;
  int64_t dropped_revoke = 0, dropped_retention = 0, dropped_device = 0;
  int32_t pool_want = 0;  // cells of the pool view asked for (0: none)

  RankedMutex metrics_mu{LockRank::Metrics};
  MetricsSnapshot snap;
  Histogram ttft = Histogram::latency(), tpot = Histogram::latency(), e2e = Histogram::latency();
  std::array<Histogram, kNumSloClasses> ttft_cls{Histogram::latency(), Histogram::latency()};
  std::array<Histogram, kNumSloClasses> tpot_cls{Histogram::latency(), Histogram::latency()};
  // Pool views (dashboard), under metrics_mu: the latest and its number.
  std::condition_variable_any pool_cv;
  std::shared_ptr<const PoolView> pool_last;
  uint64_t pool_seq = 0;
  int queued_peak = 0;  // since the last view
  void take_pool_view(double t);

  double now() const { return opts.clock(); }
  void run();
  bool wait_for_work(std::vector<PoolCommand>& cmds, std::chrono::duration<double> period);
  void take_fresh(double t);
  bool apply(std::vector<PoolCommand>& cmds, double t);
  bool drop_scope_now(pool_cmd::DropScope& d);
  bool sweep_retention(double t);
  void run_step(std::vector<TokenEvent>& events);
  void finish_thread();
  void deliver(std::vector<TokenEvent>& events, double t);
  void publish(double t);
  void log_failure(const char* what, const std::exception& ex) const {
    if (opts.log) opts.log(std::string(what) + ex.what());
  }
  static int64_t tick_of(double t) { return int64_t(std::llround(t * 1000.0)); }  // ms
};

// Engine thread: the requests submitted since the last iteration enter its
// books (owner tags for pool views, scopes with a retention TTL).
void EngineLoop::Impl::take_fresh(double t) {
  std::vector<RequestId> ids;
  {
    std::lock_guard lk(live_mu);
    ids.swap(fresh);
    for (RequestId id : ids) {
      auto it = live.find(id);
      if (it == live.end()) continue;  // rejected
      const Live& L = it->second;
      // Bounded: a forgotten owner shows as unknown.
      const uint32_t tag = owner_tag(exec->kv_scope(L.scope));
      if (owner_tenant.size() >= 4096 && !owner_tenant.count(tag)) owner_tenant.clear();
      owner_tenant[tag] = L.tenant;
      if (L.retention_s <= 0) continue;
      auto r = std::find_if(retained.begin(), retained.end(), [&](const Retained& x) { return x.scope == L.scope; });
      if (r == retained.end()) retained.push_back({L.scope, L.retention_s, t});
      else {
        r->retention_s = L.retention_s;
        r->last_submit = t;
      }
    }
  }
}

// Engine thread: a revoked tenant's cached blocks go now. True when any did.
bool EngineLoop::Impl::drop_scope_now(pool_cmd::DropScope& d) {
  std::erase_if(retained, [&](const Retained& r) { return r.scope == d.scope; });
  int64_t k = 0;
  try {
    k = exec->drop_cached_scope(d.scope);
  } catch (const std::exception& ex) {
    log_failure("prefix cache drop failed: ", ex);
  }
  dropped_revoke += k;
  return k > 0;
}

// Engine thread: cached blocks past their scope's retention. True when any went.
bool EngineLoop::Impl::sweep_retention(double t) {
  if (t < next_sweep) return false;
  next_sweep = t + opts.retention_sweep_s;
  // A scope not submitted under for a long while has been retired (the
  // server moved the tenant to a new scope): forget it.
  std::erase_if(retained, [&](const Retained& r) { return t - r.last_submit > std::max(4 * r.retention_s, 600.0); });
  int64_t n = 0;
  for (const Retained& r : retained) {
    const int64_t k = exec->drop_cached_older_than(r.scope, tick_of(t - r.retention_s));
    dropped_retention += k;
    n += k;
  }
  return n > 0;
}

// Engine thread, between steps: the inbox's commands, then the retention
// sweep when due. Metrics are published before any drop is answered, so an
// admin who reads /metrics after the revoke reply sees the blocks gone.
// True when something was published.
bool EngineLoop::Impl::apply(std::vector<PoolCommand>& cmds, double t) {
  exec->set_tick(tick_of(t));
  bool changed = false;
  std::vector<std::pair<std::promise<int64_t>*, int64_t>> answers;
  for (PoolCommand& c : cmds) {
    try {
      std::visit(PoolVisitor{
                     [&](pool_cmd::DropScope& d) {
                       const int64_t before = dropped_revoke;
                       changed |= drop_scope_now(d);
                       answers.push_back({&d.freed, dropped_revoke - before});
                     },
                     [&](pool_cmd::DropAll&) {
                       const int32_t k = exec->drop_all_cached();
                       dropped_device += k;
                       changed |= k > 0;
                     },
                     [&](pool_cmd::View& v) { pool_want = std::max(pool_want, std::max<int32_t>(1, v.max_cells)); },
                     [&](auto&) { changed |= apply_pool_command(c, *exec); },
                 },
                 c);
    } catch (const std::exception& ex) {
      log_failure("pool command failed: ", ex);
    }
  }
  changed |= sweep_retention(t);
  const bool published = changed || !answers.empty() || pool_want > 0;
  if (published) publish(t);
  for (auto& [p, n] : answers) p->set_value(n);
  cmds.clear();
  return published;
}

// Three phases so that a client never sees the end of its request before the
// metrics do: (1) update per-choice state and histograms, (2) publish the
// snapshot, (3) hand events to the sinks. A client that reads /metrics right
// after its final event therefore sees its blocks already released.
void EngineLoop::Impl::deliver(std::vector<TokenEvent>& events, double t) {
  std::lock_guard lk(live_mu);
  std::vector<char> send(events.size(), 0);
  std::vector<RequestId> finished;
  for (size_t i = 0; i < events.size(); ++i) {
    TokenEvent& e = events[i];
    auto it = live.find(e.request);
    if (it == live.end()) continue;
    Live& L = it->second;
    ChoiceText& ct = L.ch.at(size_t(e.choice));
    if (ct.done) continue;
    if (e.token >= 0) {
      if (L.first < 0) {
        L.first = t;
        ttft.observe(t - L.submitted);
        ttft_cls[size_t(L.slo)].observe(t - L.submitted);
      }
      if (ct.first < 0) ct.first = t;
      ++ct.tokens;
      if (tok && ct.tokens <= L.min_tokens) {
        e.text = ct.stop->flush() + ct.detok->push(e.token);  // no stop string ends it yet
      } else if (tok) {
        bool stopped = false;
        e.text = ct.stop->push(ct.detok->push(e.token), stopped);
        if (stopped && e.finish == FinishReason::None) {
          // The stop string ends this choice here; the scheduler only frees it.
          e.finish = FinishReason::Stop;
          e.usage = sched->usage(e.request);
          sched->end_choice(e.request, e.choice);
        } else if (stopped) {
          // The choice's last token completed the stop string: the scheduler
          // already ended it (and may have forgotten the request), so the
          // event keeps the usage the scheduler gave it.
          e.finish = FinishReason::Stop;
        }
      }
    }
    const bool final = e.finish != FinishReason::None;
    if (final && tok && e.finish != FinishReason::Rejected) {
      bool stopped = false;
      std::string tail = ct.stop->push(ct.detok->flush(), stopped);
      if (!stopped) tail += ct.stop->flush();
      e.text += tail;
    }
    if (final) {
      ct.done = true;
      --L.open;
      if (ct.first >= 0 && ct.tokens > 1) {
        tpot.observe((t - ct.first) / double(ct.tokens - 1));
        tpot_cls[size_t(L.slo)].observe((t - ct.first) / double(ct.tokens - 1));
      }
      if (L.open == 0) {
        e2e.observe(t - L.submitted);
        finished.push_back(e.request);
      }
    }
    send[i] = 1;
  }
  publish(t);
  for (size_t i = 0; i < events.size(); ++i) {
    if (!send[i]) continue;
    TokenEvent& e = events[i];
    auto it = live.find(e.request);
    assert(it != live.end());
    Live& L = it->second;
    const bool final = e.finish != FinishReason::None;
    if (L.sink && (!L.sink_failed || final)) {
      const bool ok = L.sink(std::move(e));
      if (!ok && !final && !L.sink_failed) {
        // The consumer cannot keep up or is gone: never block the engine
        // thread on it; the request is cancelled and its blocks freed.
        L.sink_failed = true;
        sched->cancel(it->first);
      }
    }
  }
  for (RequestId r : finished) live.erase(r);
}

void EngineLoop::Impl::publish(double t) {
  const SchedStats s = sched->stats(t);
  const KvStats kv = exec->kv().stats();
  std::unique_lock lk(metrics_mu);
  MetricsSnapshot& m = snap;
  m.running_requests = s.running_requests;
  m.running_seqs = s.running_seqs;
  m.queued = s.queued;
  m.kv_blocks_total = kv.total_blocks;
  m.kv_blocks_free = kv.free_blocks;
  m.kv_blocks_cached = kv.cached_blocks;
  m.kv_blocks_used = kv.used_blocks;
  m.kv_blocks_promised = s.promised_blocks;
  m.kv_headroom_blocks = s.headroom_blocks;
  m.block_size = kv.block_size;
  m.kv_block_bytes = exec->block_bytes();
  m.kv_table_blocks = kv.table_blocks;
  m.kv_table_windows.resize(kv.table_blocks.size());
  for (size_t t = 0; t < kv.table_blocks.size(); ++t)
    m.kv_table_windows[t] = exec->kv().table_window(int(t)).layer_window;
  m.prefix_query_tokens = kv.prefix_query_tokens;
  m.prefix_hit_tokens = kv.prefix_hit_tokens;
  m.prefix_dropped_revoke = dropped_revoke;
  m.prefix_dropped_retention = dropped_retention;
  m.prefix_dropped_device = dropped_device;
  m.preemptions = s.preemptions;
  m.prefix_waits = s.prefix_waits;
  m.rejections = s.rejections;
  m.requests_submitted = s.submitted;
  m.requests_finished = s.finished;
  m.requests_cancelled = s.cancelled;
  m.requests_failed = s.failed;
  m.prompt_tokens = s.prompt_tokens;
  m.prefill_tokens = s.prefill_tokens;
  m.generated_tokens = s.generated_tokens;
  m.steps = s.steps;
  m.drain_blocks_per_s = s.drain_blocks_per_s;
  m.ttft = ttft;
  m.tpot = tpot;
  m.e2e = e2e;
  m.ttft_by_class = ttft_cls;
  m.tpot_by_class = tpot_cls;
  m.tenant_blocks = s.tenant_blocks;
  m.tenant_quota_blocks = s.tenant_quota;
  m.recent_rejects = s.recent_rejects;
  queued_peak = std::max(queued_peak, m.queued[0] + m.queued[1]);
  lk.unlock();
  if (pool_want > 0) take_pool_view(t);
}

// Engine thread, right after publish(): nothing changes the pool in between,
// so the view's counts are the published ones.
void EngineLoop::Impl::take_pool_view(double t) {
  auto v = std::make_shared<PoolView>();
  v->t = t;
  v->cells = snapshot_pool(exec->kv(), std::exchange(pool_want, 0));
  for (uint32_t tag : v->cells.owners) {
    auto it = owner_tenant.find(tag);
    v->owner_tenants.push_back(it == owner_tenant.end() ? std::string() : it->second);
  }
  std::lock_guard lk(metrics_mu);
  v->metrics = snap;
  v->queued_peak = std::max(queued_peak, snap.queued[0] + snap.queued[1]);
  queued_peak = 0;
  pool_last = std::move(v);
  ++pool_seq;
  pool_cv.notify_all();
}

// Waits for requests, commands or the sweep period; false on stop.
bool EngineLoop::Impl::wait_for_work(std::vector<PoolCommand>& cmds, std::chrono::duration<double> period) {
  std::unique_lock lk(inbox_mu);
  cv.wait_for(lk, period, [&] { return stop || sched->has_work() || !inbox.empty(); });
  if (stop) return false;
  cmds.swap(inbox);
  return true;
}

void EngineLoop::Impl::run_step(std::vector<TokenEvent>& events) {
  events.clear();
  double t = now();
  exec->set_tick(tick_of(t));
  StepReport rep;
  try {
    rep = sched->step(t, events);
  } catch (const std::exception& ex) {
    // A failing forward is handled inside step() (its requests fail). This
    // is the scheduler itself failing: retrying the same state would fail
    // forever, so every request ends with an error and the loop goes on.
    log_failure("engine step failed, failing all requests: ", ex);
    try {
      sched->fail_all(std::string("the engine failed: ") + ex.what(), events);
    } catch (const std::exception& ex2) {
      log_failure("could not fail the requests: ", ex2);
    }
  }
  t = now();
  deliver(events, t);  // publishes the metrics too
  if (rep.seqs == 0 && events.empty()) {
    // Nothing could run (waiting for a wait limit or a cancel): do not spin.
    std::unique_lock lk(inbox_mu);
    cv.wait_for(lk, std::chrono::milliseconds(2), [&] { return stop || !inbox.empty(); });
  }
}

void EngineLoop::Impl::run() {
  std::vector<TokenEvent> events;
  std::vector<PoolCommand> cmds;
  const auto sweep_period = std::chrono::duration<double>(std::max(0.001, opts.retention_sweep_s));
  while (wait_for_work(cmds, sweep_period)) {
    const double t = now();
    take_fresh(t);
    const bool published = apply(cmds, t);
    if (!sched->has_work()) {
      if (!published) publish(t);
      continue;
    }
    run_step(events);
  }
  finish_thread();
}

// The last commands still run here (this thread owns the pool until it is
// joined); any later one is answered by post() itself.
void EngineLoop::Impl::finish_thread() {
  std::vector<PoolCommand> cmds;
  {
    std::lock_guard lk(inbox_mu);
    cmds.swap(inbox);
    exited = true;
  }
  apply(cmds, now());
  std::vector<TokenEvent> events;
  const double t = now();
  sched->abort_all(RejectReason::ShuttingDown, t, events);
  deliver(events, t);
}

std::unique_ptr<PagedExecutor> paged_executor(Engine& engine, const EngineLoopOptions& o) {
  check_block_size_option(o.block_size);
  PagedEngineOptions p;
  p.block_size = o.block_size;
  p.kv_memory_bytes = o.kv_memory_bytes;
  p.n_blocks = o.kv_blocks;
  p.max_ctx = o.max_ctx;
  p.prefix_caching = o.prefix_caching;
  p.cache = o.cache;
  p.window = o.window;
  p.max_step_tokens = o.sched.max_batch_tokens;
  return std::make_unique<PagedExecutor>(engine, p);
}

EngineLoop::EngineLoop(Engine& engine, const Tokenizer* tokenizer, const EngineLoopOptions& opts)
    : EngineLoop(paged_executor(engine, opts), tokenizer, opts) {}

EngineLoop::EngineLoop(std::unique_ptr<StepExecutor> exec, const Tokenizer* tokenizer, const EngineLoopOptions& opts)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opts = opts;
  if (!m.opts.clock) m.opts.clock = steady_now;
  if (!m.opts.log) m.opts.log = [](const std::string& s) { std::fprintf(stderr, "kvserve: %s\n", s.c_str()); };
  m.exec = std::move(exec);
  m.tok = tokenizer;
  std::function<bool(int32_t)> eog;
  if (tokenizer) eog = [tokenizer](int32_t t) { return ends_generation(*tokenizer, t); };
  m.sched = std::make_unique<Scheduler>(*m.exec, m.opts.sched, eog, m.opts.log);
  if (tokenizer) {
    const int nv = m.exec->n_vocab();
    m.sched->set_vocabulary([tokenizer, nv](bool specials) {
      // A token's text as it adds to what came before (no leading-space
      // rule: the grammar sees the completion, not the text after BOS), as
      // the request's detokenizer renders it.
      std::vector<std::string> pieces(static_cast<size_t>(nv));
      for (int id = 0; id < nv && id < tokenizer->n_vocab(); ++id)
        if (!tokenizer->is_eog(id)) pieces[size_t(id)] = token_text(*tokenizer, id, specials);
      return pieces;
    });
  }
  m.publish(m.now());
  m.th = std::thread([&m] {
    mark_compute_thread();  // the forward runs here too (pool thread 0)
    m.exec->kv().bind_owner_thread();  // the pool's one writer from now on
    m.run();
  });
}

EngineLoop::~EngineLoop() { shutdown(); }

// Takes the live lock to register the request's sink and text state, then
// the scheduler's to admit or refuse it, never both at once; the engine
// thread's books (owner tags, retention) follow from `fresh`.
SubmitResult EngineLoop::submit(Request req) {
  Impl& m = *impl_;
  const double t = m.now();
  if (req.id == 0) req.id = m.next_id.fetch_add(1, std::memory_order_relaxed);
  const RequestId id = req.id;
  Live L;
  L.sink = std::move(req.sink);
  L.slo = req.slo;
  L.submitted = t;
  L.open = req.n;
  L.min_tokens = req.min_tokens;
  L.ch.resize(size_t(std::clamp(req.n, 0, m.opts.sched.max_seqs)));
  for (ChoiceText& c : L.ch) {
    if (m.tok) c.detok = std::make_unique<Detokenizer>(*m.tok, req.special_text);
    c.stop = std::make_unique<StopMatcher>(req.stop);
  }
  L.scope = req.scope;
  L.tenant = req.tenant;
  L.retention_s = req.retention_s;
  bool mine = false;  // this call registered the id (another request may hold it)
  if (req.n >= 1 && req.n <= m.opts.sched.max_seqs) {  // else the scheduler refuses it
    std::lock_guard lk(m.live_mu);
    mine = m.live.try_emplace(id, std::move(L)).second;
    if (mine) m.fresh.push_back(id);
  }
  const SubmitResult res = m.sched->submit(std::move(req), t);
  if (!res.accepted && mine) {
    std::lock_guard lk(m.live_mu);
    m.live.erase(id);
  }
  if (res.accepted) m.wake();
  return res;
}

void EngineLoop::post(PoolCommand c) {
  Impl& m = *impl_;
  {
    std::lock_guard lk(m.inbox_mu);
    if (m.exited) {
      refuse_pool_command(c);
      return;
    }
    m.inbox.push_back(std::move(c));
  }
  m.cv.notify_one();
}

void EngineLoop::set_shed_limits(const ShedLimits& s) {
  Impl& m = *impl_;
  const ShedLimits before = m.sched->shed();
  m.sched->set_shed(s);
  if (s.drop_prefix_cache && !before.drop_prefix_cache) post(pool_cmd::DropAll{});
}

ShedLimits EngineLoop::shed_limits() const { return impl_->sched->shed(); }

int64_t EngineLoop::drop_scope(const Scope& scope) {
  pool_cmd::DropScope d;
  d.scope = scope;
  std::future<int64_t> f = d.freed.get_future();
  post(std::move(d));
  return f.get();
}

void EngineLoop::release_held(int64_t seq) { post(pool_cmd::Release{seq}); }

bool EngineLoop::cancel(RequestId id) {
  const bool ok = impl_->sched->cancel(id);
  if (ok) impl_->wake();
  return ok;
}

MetricsSnapshot EngineLoop::metrics() const {
  MetricsSnapshot m;
  {
    std::lock_guard lk(impl_->metrics_mu);
    m = impl_->snap;
  }
  // Immediate rejections happen between steps: read them live (lock-free).
  m.rejections = impl_->sched->rejections();
  m.requests_submitted = impl_->sched->submitted();
  return m;
}

std::shared_ptr<const PoolView> EngineLoop::pool_view(int32_t max_cells, double timeout_s) {
  Impl& m = *impl_;
  uint64_t seen;
  {
    std::lock_guard lk(m.metrics_mu);
    seen = m.pool_seq;
  }
  post(pool_cmd::View{std::max<int32_t>(1, max_cells)});
  std::unique_lock lk(m.metrics_mu);
  m.pool_cv.wait_for(lk, std::chrono::duration<double>(std::max(0.0, timeout_s)), [&] { return m.pool_seq != seen; });
  return m.pool_last;
}

void EngineLoop::drain() {
  impl_->sched->set_accepting(false);
  wait_idle();
}

void EngineLoop::wait_idle() {
  // Done when the scheduler holds nothing and every final event has left.
  while (true) {
    {
      std::lock_guard lk(impl_->inbox_mu);
      if (impl_->stop) return;
    }
    {
      std::lock_guard lk(impl_->live_mu);
      if (impl_->live.empty() && !impl_->sched->has_work()) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void EngineLoop::shutdown() {
  Impl& m = *impl_;
  {
    std::lock_guard lk(m.inbox_mu);
    if (m.stop && !m.th.joinable()) return;
    m.stop = true;
  }
  m.sched->set_accepting(false);
  m.cv.notify_all();
  if (m.th.joinable()) {
    m.th.join();
    m.exec->kv().bind_owner_thread();  // the engine thread is gone: the pool is the caller's
  }
}

const EngineLoopOptions& EngineLoop::options() const { return impl_->opts; }
int64_t EngineLoop::kv_blocks_total() const { return impl_->sched->limits().total; }
int EngineLoop::block_size() const { return impl_->exec->kv().block_size(); }

}  // namespace kvs::sched
