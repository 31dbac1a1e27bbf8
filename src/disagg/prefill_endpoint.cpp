#include "disagg/prefill_endpoint.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "disagg/ucx_link.h"
#include "disagg/wire.h"

namespace kvs::disagg {

using Clock = std::chrono::steady_clock;

const char* to_string(ShipResult::Status s) {
  switch (s) {
    case ShipResult::Status::Ok: return "ok";
    case ShipResult::Status::NoRoom: return "no_room";
    case ShipResult::Status::Refused: return "refused";
    case ShipResult::Status::Failed: return "failed";
  }
  return "?";
}

namespace {
struct Pending {
  const Shipment* s = nullptr;
  ConnId conn = 0;
  ShipResult r;
  bool finished = false;
  int sends = 0;  // sends UCX may still read memory for
};
}  // namespace

struct PrefillEndpoint::State {
  KvIdentity me;
  PrefillOptions opts;
  std::function<void(const std::string&)> log;
  mutable std::mutex mu;
  std::condition_variable cv;
  enum class Conn { None, Greeting, Ready, Refused } conn_state = Conn::None;
  ConnId conn = 0;
  std::string conn_error;
  uint64_t next_xfer = 1;
  std::unordered_map<uint64_t, Pending*> pending;
  std::unique_ptr<UcxLink> link;  // last member: stopped first

  void on_message(ConnId c, std::span<const uint8_t> h);
  void on_answer(const Answer& a);
  void on_disconnect(ConnId c, const std::string& why);
  void finish(Pending& p, ShipResult::Status st, const std::string& why) {
    if (p.finished) return;
    p.finished = true;
    p.r.status = st;
    p.r.reason = why;
  }
  void send_tracked(Pending& p, std::vector<uint8_t> hdr, std::span<const uint8_t> data) {
    ++p.sends;
    link->send(p.conn, std::move(hdr), data, [this, &p](bool ok) {
      std::lock_guard lk(mu);
      --p.sends;
      if (!ok) finish(p, ShipResult::Status::Failed, "send to the decode worker failed");
      cv.notify_all();
    });
  }
  void ensure_connected(std::unique_lock<std::mutex>& lk);
};

void PrefillEndpoint::State::on_message(ConnId c, std::span<const uint8_t> h) {
  std::lock_guard lk(mu);
  if (c != conn) return;
  const auto type = peek_type(h);
  if (type == MsgType::HelloReply) {
    const auto r = decode_hello_reply(h);
    if (!r) conn_error = "garbled handshake reply from the decode worker";
    else if (!r->ok) conn_error = r->reason;
    else if (const std::string why = mismatch(me, r->identity); !why.empty())
      conn_error = "prefill worker refuses the decode worker: " + why;
    conn_state = conn_error.empty() ? Conn::Ready : Conn::Refused;
    if (conn_state == Conn::Refused && log) log("kv transfer: " + conn_error);
  } else if (type == MsgType::Answer) {
    if (const auto a = decode_answer(h)) on_answer(*a);
  } else if (type == MsgType::Result) {
    const auto r = decode_result(h);
    auto it = r ? pending.find(r->xfer) : pending.end();
    if (it != pending.end()) {
      it->second->r.handle = r->handle;
      finish(*it->second, r->ok ? ShipResult::Status::Ok : ShipResult::Status::Failed,
             r->ok ? "" : "decode worker: " + r->reason);
    }
  }
  cv.notify_all();
}

void PrefillEndpoint::State::on_answer(const Answer& a) {
  auto it = pending.find(a.xfer);
  if (it == pending.end() || it->second->finished) return;
  Pending& p = *it->second;
  if (a.kind == AnswerKind::NoRoom) {
    p.r.retry_after_s = a.retry_after_ms / 1e3;
    return finish(p, ShipResult::Status::NoRoom, "decode worker: " + a.reason);
  }
  if (a.kind == AnswerKind::Refused) return finish(p, ShipResult::Status::Refused, "decode worker: " + a.reason);
  if (a.to > p.s->blocks.size()) return finish(p, ShipResult::Status::Failed, "decode worker asked for blocks past the prompt");
  p.r.blocks_skipped = a.from;
  for (uint32_t i = a.from; i < a.to; ++i) {
    send_tracked(p, encode(BlockHeader{a.xfer, i}), p.s->blocks[i]);
    p.r.blocks_sent += 1;
    p.r.bytes += int64_t(p.s->blocks[i].size());
  }
  const auto* res = reinterpret_cast<const uint8_t*>(p.s->residual.data());
  send_tracked(p, encode(DoneHeader{a.xfer, a.to - a.from}), {res, p.s->residual.size() * sizeof(float)});
}

void PrefillEndpoint::State::on_disconnect(ConnId c, const std::string& why) {
  std::lock_guard lk(mu);
  if (c != conn) return;
  if (conn_state == Conn::Greeting || conn_state == Conn::Ready) conn_error = "decode worker unreachable: " + why;
  if (conn_state != Conn::Refused) conn_state = Conn::None;
  for (auto& [id, p] : pending)
    if (p->conn == c) finish(*p, ShipResult::Status::Failed, "decode worker disconnected: " + why);
  if (log) log("kv transfer: " + conn_error);
  cv.notify_all();
}

void PrefillEndpoint::State::ensure_connected(std::unique_lock<std::mutex>& lk) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(opts.timeout_s);
  cv.wait_until(lk, deadline, [&] { return conn_state != Conn::Greeting; });  // another ship is connecting
  if (conn_state == Conn::Ready) return;
  conn_state = Conn::Greeting;
  conn_error.clear();
  conn = link->connect(opts.host, opts.port);
  link->send(conn, encode_hello(me), {});
  cv.wait_until(lk, deadline, [&] { return conn_state != Conn::Greeting; });
  if (conn_state == Conn::Ready) return;
  const bool refused = conn_state == Conn::Refused;
  if (conn_state == Conn::Greeting) conn_error = "decode worker did not answer the handshake in time";
  link->close(conn);
  conn_state = Conn::None;
  const std::string msg = conn_error.empty() ? "decode worker unreachable" : conn_error;
  if (refused) throw HandshakeError(msg);
  throw std::runtime_error(msg + " (" + opts.host + ":" + std::to_string(opts.port) + ")");
}

PrefillEndpoint::PrefillEndpoint(const KvIdentity& mine, const PrefillOptions& opts,
                                 std::function<void(const std::string&)> log)
    : st_(std::make_unique<State>()) {
  State* s = st_.get();
  s->me = mine;
  s->opts = opts;
  s->log = std::move(log);
  UcxLink::Handlers h;
  h.on_message = [s](ConnId c, std::span<const uint8_t> hd, Incoming&) { s->on_message(c, hd); };
  h.on_disconnect = [s](ConnId c, const std::string& why) { s->on_disconnect(c, why); };
  s->link = std::make_unique<UcxLink>(std::move(h));
  std::unique_lock lk(s->mu);
  s->ensure_connected(lk);
}

PrefillEndpoint::~PrefillEndpoint() { st_->link.reset(); }

bool PrefillEndpoint::connected() const {
  std::lock_guard lk(st_->mu);
  return st_->conn_state == State::Conn::Ready;
}

ShipResult PrefillEndpoint::ship(const Shipment& s) {
  State& m = *st_;
  const auto t0 = Clock::now();
  std::unique_lock lk(m.mu);
  Pending p;
  p.s = &s;
  try {
    m.ensure_connected(lk);
  } catch (const std::exception& e) {
    p.r.reason = e.what();
    p.r.status = dynamic_cast<const HandshakeError*>(&e) ? ShipResult::Status::Refused : ShipResult::Status::Failed;
    counters_.add_failed();
    return p.r;
  }
  p.conn = m.conn;
  const uint64_t xfer = m.next_xfer++;
  m.pending[xfer] = &p;
  m.send_tracked(p, encode(Offer{xfer, s.scope, s.first_token, s.prompt, s.keys}), {});
  const auto deadline = t0 + std::chrono::duration<double>(m.opts.timeout_s);
  if (!m.cv.wait_until(lk, deadline, [&] { return p.finished; })) {
    m.finish(p, ShipResult::Status::Failed, "kv transfer timed out");
    m.link->close(p.conn);  // cancels its sends; the next ship reconnects
    m.conn_state = State::Conn::None;
  }
  m.cv.wait(lk, [&] { return p.sends == 0; });  // UCX no longer reads the shipment
  m.pending.erase(xfer);
  p.r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (p.r.status == ShipResult::Status::Ok) counters_.add_ok(p.r.blocks_sent, p.r.bytes, p.r.blocks_skipped, p.r.seconds);
  else if (p.r.status == ShipResult::Status::NoRoom) counters_.add_no_room();
  else counters_.add_failed();
  return p.r;
}

}  // namespace kvs::disagg
