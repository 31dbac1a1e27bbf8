#include "disagg/decode_endpoint.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "disagg/ucx_link.h"
#include "disagg/wire.h"

namespace kvs::disagg {

using Clock = std::chrono::steady_clock;

namespace {
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Xfer {
  ConnId conn = 0;
  uint64_t id = 0;
  AdoptionPool::Reservation res;
  std::vector<int32_t> prompt;
  Scope scope;
  int32_t first_token = -1;
  uint32_t from = 0, to = 0;
  std::vector<bool> got;
  uint32_t n_got = 0;
  int pending = 0;  // receives UCX is still writing into pool memory
  bool failed = false, done_seen = false;
  Clock::time_point start = Clock::now();
  int64_t bytes = 0;
};
}  // namespace

struct DecodeEndpoint::State {
  AdoptionPool& pool;
  DecodeOptions opts;
  std::function<void(const std::string&)> log;
  KvIdentity me;
  TransferCounters& counters;
  // Progress thread only.
  std::unordered_set<ConnId> greeted;
  std::map<std::pair<ConnId, uint64_t>, std::unique_ptr<Xfer>> xfers;
  // Any thread.
  mutable std::mutex mu;
  struct Held {
    Adopted a;
    Clock::time_point at;
  };
  std::unordered_map<uint64_t, Held> adopted;
  uint64_t next_handle = 1;
  std::atomic<int64_t> n_xfers{0};
  std::unique_ptr<UcxLink> link;  // last member: stopped before the rest goes

  State(AdoptionPool& p, const DecodeOptions& o, std::function<void(const std::string&)> l, TransferCounters& c)
      : pool(p), opts(o), log(std::move(l)), me(p.identity()), counters(c) {}
  void say(const std::string& s) const {
    if (log) log("kv transfer: " + s);
  }
  void on_message(ConnId c, std::span<const uint8_t> h, Incoming& in);
  void on_hello(ConnId c, std::span<const uint8_t> h);
  void on_offer(ConnId c, std::span<const uint8_t> h);
  void on_block(ConnId c, std::span<const uint8_t> h, Incoming& in);
  void on_done(ConnId c, std::span<const uint8_t> h, Incoming& in);
  void answer(ConnId c, const Answer& a) { link->send(c, encode(a), {}); }
  void fail(Xfer& x, const std::string& why, bool reply);
  void settle(Xfer& x);
  void drop_conn(ConnId c, const std::string& why, bool close);
  void tick();
  Xfer* find(ConnId c, uint64_t id) {
    auto it = xfers.find({c, id});
    return it == xfers.end() ? nullptr : it->second.get();
  }
};

void DecodeEndpoint::State::on_message(ConnId c, std::span<const uint8_t> h, Incoming& in) {
  const auto type = peek_type(h);
  if (type == MsgType::Hello) return on_hello(c, h);
  if (!type) return drop_conn(c, "garbled message (unknown type)", true);
  if (!greeted.count(c)) return drop_conn(c, "message before the handshake", true);
  switch (*type) {
    case MsgType::Offer: return on_offer(c, h);
    case MsgType::Block: return on_block(c, h, in);
    case MsgType::Done: return on_done(c, h, in);
    default: return drop_conn(c, "unexpected message type " + std::to_string(int(*type)), true);
  }
}

void DecodeEndpoint::State::on_hello(ConnId c, std::span<const uint8_t> h) {
  const auto theirs = decode_hello(h);
  if (!theirs) return drop_conn(c, "garbled handshake", true);
  HelloReply r;
  r.identity = me;
  r.reason = mismatch(me, *theirs);
  r.ok = r.reason.empty();
  if (!r.ok) {
    r.reason = "decode worker refuses the prefill worker: " + r.reason;
    say(r.reason);
    // The prefill side closes once it has read why; closing here could
    // reset the connection before the reply arrives. An unverified peer can
    // do nothing else: any other message drops it.
    link->send(c, encode(r), {});
    return;
  }
  greeted.insert(c);
  link->send(c, encode(r), {});
}

void DecodeEndpoint::State::on_offer(ConnId c, std::span<const uint8_t> h) {
  auto o = decode_offer(h);
  if (!o) return drop_conn(c, "garbled offer", true);
  Answer a;
  a.xfer = o->xfer;
  if (find(c, o->xfer)) {
    a.reason = "transfer id already in use";
    return answer(c, a);
  }
  if (o->keys != pool.chain_keys(o->tokens, o->scope)) {
    a.reason = "chain keys differ from this worker's for the same tokens (garbled offer or another model)";
    say(a.reason);
    return answer(c, a);
  }
  AdoptionPool::Reservation res = pool.reserve(o->tokens, o->scope);
  if (res.seq < 0) {
    a.kind = res.error.empty() ? AnswerKind::NoRoom : AnswerKind::Refused;
    a.reason = res.error.empty() ? "decode worker has no free KV blocks" : res.error;
    a.retry_after_ms = opts.retry_after_ms;
    if (res.error.empty()) counters.add_no_room();
    return answer(c, a);
  }
  auto x = std::make_unique<Xfer>();
  x->conn = c;
  x->id = o->xfer;
  x->from = uint32_t(res.hit_blocks);
  x->to = x->from + uint32_t(res.blocks.size());
  x->got.assign(res.blocks.size(), false);
  x->res = std::move(res);
  x->prompt = std::move(o->tokens);
  x->scope = o->scope;
  x->first_token = o->first_token;
  a.kind = AnswerKind::Send;
  a.from = x->from;
  a.to = x->to;
  xfers[{c, o->xfer}] = std::move(x);
  ++n_xfers;
  answer(c, a);
}

void DecodeEndpoint::State::on_block(ConnId c, std::span<const uint8_t> h, Incoming& in) {
  const auto b = decode_block(h);
  if (!b) return drop_conn(c, "garbled block header", true);
  Xfer* x = find(c, b->xfer);
  if (!x || x->failed) return;  // ended already: its data is dropped
  if (b->index < x->from || b->index >= x->to || x->got[b->index - x->from])
    return fail(*x, "block index " + std::to_string(b->index) + " outside the asked range or repeated", true);
  std::span<uint8_t> dst = x->res.blocks[b->index - x->from];
  if (in.length != dst.size())
    return fail(*x, "block of " + std::to_string(in.length) + " bytes, expected " + std::to_string(dst.size()), true);
  ++x->pending;
  const uint32_t idx = b->index - x->from;
  link->recv_data(in, dst, [this, x, idx, n = int64_t(dst.size())](bool ok) {
    --x->pending;
    if (!ok) return fail(*x, "block receive failed", true);  // settles
    if (!x->failed) {
      x->got[idx] = true;
      ++x->n_got;
      x->bytes += n;
    }
    settle(*x);
  });
}

void DecodeEndpoint::State::on_done(ConnId c, std::span<const uint8_t> h, Incoming& in) {
  const auto d = decode_done(h);
  if (!d) return drop_conn(c, "garbled done", true);
  Xfer* x = find(c, d->xfer);
  if (!x || x->failed) return;
  std::span<uint8_t> res(reinterpret_cast<uint8_t*>(x->res.residual.data()), x->res.residual.size_bytes());
  if (in.length != res.size() || d->blocks != x->to - x->from)
    return fail(*x, "truncated transfer: done after " + std::to_string(d->blocks) + " of " +
                        std::to_string(x->to - x->from) + " blocks, residual " + std::to_string(in.length) +
                        " of " + std::to_string(res.size()) + " bytes", true);
  ++x->pending;
  link->recv_data(in, res, [this, x](bool ok) {
    --x->pending;
    x->done_seen = true;
    if (!ok) return fail(*x, "residual receive failed", true);  // settles
    settle(*x);
  });
}

void DecodeEndpoint::State::fail(Xfer& x, const std::string& why, bool reply) {
  if (!x.failed) {
    x.failed = true;
    counters.add_failed();
    say("transfer " + std::to_string(x.id) + " failed, reserved blocks freed: " + why);
    if (reply) link->send(x.conn, encode(Result{x.id, false, 0, why}), {});
  }
  settle(x);
}

// Ends a transfer once UCX writes nothing more into its blocks: adopted
// when every block and the residual arrived, else its blocks are freed.
void DecodeEndpoint::State::settle(Xfer& x) {
  if (x.pending > 0) return;
  if (!x.failed && !x.done_seen) return;
  if (!x.failed && x.n_got != x.to - x.from) return fail(x, "done before every block arrived", true);
  const auto key = std::make_pair(x.conn, x.id);
  if (!x.failed) {
    if (const std::string e = pool.finish(x.res.seq, x.prompt); !e.empty()) return fail(x, "adoption failed: " + e, true);
  }
  if (x.failed) {
    pool.abort(x.res.seq);
  } else {
    counters.add_ok(x.n_got, x.bytes, x.from, since(x.start));
    uint64_t handle;
    {
      std::lock_guard lk(mu);
      handle = next_handle++;
      adopted[handle] = {Adopted{x.res.seq, std::move(x.prompt), x.scope, x.first_token, int32_t(x.n_got),
                                 int32_t(x.from)},
                         Clock::now()};
    }
    link->send(x.conn, encode(Result{x.id, true, handle, {}}), {});
  }
  xfers.erase(key);
  --n_xfers;
}

void DecodeEndpoint::State::drop_conn(ConnId c, const std::string& why, bool close) {
  const bool was_greeted = greeted.erase(c) > 0;
  std::vector<Xfer*> mine;
  for (auto& [k, x] : xfers)
    if (k.first == c) mine.push_back(x.get());
  // A refused peer hanging up is expected: not worth a line.
  if (close || was_greeted || !mine.empty()) say("connection " + std::to_string(c) + " dropped: " + why);
  for (Xfer* x : mine) fail(*x, why, false);
  if (close) link->close(c);
}

void DecodeEndpoint::State::tick() {
  std::vector<Xfer*> late;
  for (auto& [k, x] : xfers)
    if (!x->failed && since(x->start) > opts.transfer_timeout_s) late.push_back(x.get());
  for (Xfer* x : late) fail(*x, "timed out", true);
  std::vector<SeqId> expired;
  {
    std::lock_guard lk(mu);
    for (auto it = adopted.begin(); it != adopted.end();) {
      if (since(it->second.at) <= opts.claim_timeout_s) {
        ++it;
        continue;
      }
      expired.push_back(it->second.a.seq);
      it = adopted.erase(it);
    }
  }
  for (SeqId s : expired) {
    say("adopted sequence never claimed: freed");
    pool.abort(s);
  }
}

DecodeEndpoint::DecodeEndpoint(AdoptionPool& pool, const DecodeOptions& opts, std::function<void(const std::string&)> log)
    : st_(std::make_unique<State>(pool, opts, std::move(log), counters_)) {
  State* s = st_.get();
  UcxLink::Handlers h;
  h.on_message = [s](ConnId c, std::span<const uint8_t> hd, Incoming& in) { s->on_message(c, hd, in); };
  h.on_disconnect = [s](ConnId c, const std::string& why) { s->drop_conn(c, why, false); };
  h.on_tick = [s] { s->tick(); };
  s->link = std::make_unique<UcxLink>(std::move(h));
  port_ = s->link->listen(opts.host, opts.port);
}

DecodeEndpoint::~DecodeEndpoint() {
  st_->link.reset();  // no callback runs after this, and UCX writes nothing more
  for (auto& [k, x] : st_->xfers) st_->pool.abort(x->res.seq);
  for (auto& [h, held] : st_->adopted) st_->pool.abort(held.a.seq);
}

std::optional<Adopted> DecodeEndpoint::claim(uint64_t handle) {
  std::lock_guard lk(st_->mu);
  auto it = st_->adopted.find(handle);
  if (it == st_->adopted.end()) return std::nullopt;
  Adopted a = std::move(it->second.a);
  st_->adopted.erase(it);
  return a;
}

int64_t DecodeEndpoint::holding() const {
  std::lock_guard lk(st_->mu);
  return st_->n_xfers.load() + int64_t(st_->adopted.size());
}

}  // namespace kvs::disagg
