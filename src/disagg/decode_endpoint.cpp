#include "disagg/decode_endpoint.h"

#include <openssl/rand.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
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
    int64_t blocks = 0;    // entries of the prompt's block list it pins
    bool awaited = false;  // its request arrived (await_claim)
    uint64_t handle = 0;   // the name the prefill side was given
  };
  std::map<uint64_t, Held> adopted;  // by arrival number: oldest first
  // Handles are random, not counted: any client of the decode worker may
  // name one, and a counted one could be guessed and claimed with another
  // prompt, which frees someone else's hand-over.
  std::unordered_map<uint64_t, uint64_t> arrival_of;  // handle -> key in adopted
  uint64_t next_arrival = 1;
  std::map<uint64_t, Held>::iterator find_handle(uint64_t h) {
    const auto a = arrival_of.find(h);
    return a == arrival_of.end() ? adopted.end() : adopted.find(a->second);
  }
  uint64_t new_handle() {  // under mu: random, nonzero, not in use
    for (;;) {
      uint64_t h = 0;
      if (RAND_bytes(reinterpret_cast<unsigned char*>(&h), sizeof h) != 1)
        throw std::runtime_error("hand-over handle: the system random source failed");
      h &= (uint64_t(1) << 53) - 1;  // exact as a JSON number in any client (a double)
      if (h != 0 && !arrival_of.count(h)) return h;
    }
  }
  int64_t orphan_blocks = 0;         // blocks of adoptions not awaited
  bool closed = false;               // the endpoint is gone: holds dropped later do nothing
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
  // Under mu: takes `it` out of `adopted`; its sequence, for pool.abort
  // once mu is released.
  SeqId take(std::map<uint64_t, Held>::iterator it);
  // Under mu: the oldest adoptions no request came for, `newest` aside,
  // taken out until the rest fit unclaimed_max_blocks.
  std::vector<SeqId> over_bound(uint64_t newest);
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
    std::vector<SeqId> freed;
    {
      std::lock_guard lk(mu);
      handle = new_handle();
      const uint64_t arrival = next_arrival++;
      adopted[arrival] = {Adopted{x.res.seq, std::move(x.prompt), x.scope, x.first_token, int32_t(x.n_got),
                                  int32_t(x.from)},
                          Clock::now(), int64_t(x.to), false, handle};
      arrival_of[handle] = arrival;
      orphan_blocks += int64_t(x.to);
      freed = over_bound(arrival);
    }
    for (const SeqId seq : freed) pool.abort(seq);
    link->send(x.conn, encode(Result{x.id, true, handle, {}}), {});
  }
  xfers.erase(key);
  --n_xfers;
}

SeqId DecodeEndpoint::State::take(std::map<uint64_t, Held>::iterator it) {
  if (!it->second.awaited) orphan_blocks -= it->second.blocks;
  const SeqId seq = it->second.a.seq;
  arrival_of.erase(it->second.handle);
  adopted.erase(it);
  return seq;
}

std::vector<SeqId> DecodeEndpoint::State::over_bound(uint64_t newest) {
  std::vector<SeqId> out;
  const int64_t bound = opts.unclaimed_max_blocks;
  for (auto it = adopted.begin(); bound > 0 && orphan_blocks > bound && it != adopted.end();) {
    if (it->second.awaited || it->first == newest) {
      ++it;
      continue;
    }
    const uint64_t h = it->second.handle;
    const int64_t n = it->second.blocks;
    out.push_back(take(it++));
    counters.add_unclaimed_released();
    say("hand-over " + std::to_string(h) + " (" + std::to_string(n) +
        " blocks) freed before any request came for it: hand-overs nobody asked for held " +
        std::to_string(orphan_blocks + n) + " blocks, over the bound of " + std::to_string(bound) +
        " (--kv-unclaimed-max-blocks); the oldest go first");
  }
  return out;
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
      expired.push_back(take(it++));
    }
  }
  for (SeqId s : expired) {
    say("adopted sequence never claimed: freed");
    pool.abort(s);
  }
}

DecodeEndpoint::DecodeEndpoint(AdoptionPool& pool, const DecodeOptions& opts, std::function<void(const std::string&)> log)
    : st_(std::make_shared<State>(pool, opts, std::move(log), counters_)) {
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
  std::lock_guard lk(st_->mu);
  st_->closed = true;
  for (auto& [k, x] : st_->xfers) st_->pool.abort(x->res.seq);
  for (auto& [h, held] : st_->adopted) st_->pool.abort(held.a.seq);
}

std::optional<Adopted> DecodeEndpoint::claim(uint64_t handle) {
  std::lock_guard lk(st_->mu);
  auto it = st_->find_handle(handle);
  if (it == st_->adopted.end()) return std::nullopt;
  Adopted a = std::move(it->second.a);
  st_->take(it);
  return a;
}

std::shared_ptr<void> DecodeEndpoint::await_claim(uint64_t handle) {
  {
    std::lock_guard lk(st_->mu);
    auto it = st_->find_handle(handle);
    if (it == st_->adopted.end() || it->second.awaited) return nullptr;
    it->second.awaited = true;
    st_->orphan_blocks -= it->second.blocks;
  }
  // A request that ends unclaimed (cancelled or refused in the queue) never
  // will be: its blocks go now, not at the claim timeout.
  std::weak_ptr<State> weak = st_;
  return std::shared_ptr<void>(nullptr, [weak, handle](void*) {
    const std::shared_ptr<State> s = weak.lock();
    if (!s) return;
    // Under mu: the endpoint (and the pool) cannot go meanwhile.
    std::lock_guard lk(s->mu);
    auto it = s->find_handle(handle);
    if (s->closed || it == s->adopted.end()) return;
    s->pool.abort(s->take(it));
    s->say("hand-over " + std::to_string(handle) + ": its request ended before claiming it: freed");
  });
}

int64_t DecodeEndpoint::unclaimed_blocks() const {
  std::lock_guard lk(st_->mu);
  return st_->orphan_blocks;
}

int64_t DecodeEndpoint::holding() const {
  std::lock_guard lk(st_->mu);
  return st_->n_xfers.load() + int64_t(st_->adopted.size());
}

}  // namespace kvs::disagg
