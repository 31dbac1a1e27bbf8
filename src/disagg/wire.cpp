#include "disagg/wire.h"

#include <cstring>

namespace kvs::disagg {

namespace {

// Little-endian fixed-width fields and length-prefixed strings.
class Writer {
 public:
  explicit Writer(MsgType t) {
    b_.reserve(128);
    b_.push_back(uint8_t(t));
  }
  void u8(uint8_t v) { b_.push_back(v); }
  void u32(uint32_t v) { raw(&v, 4); }
  void i32(int32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void str(const std::string& s) {
    u32(uint32_t(s.size()));
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = b_.size();
    b_.resize(at + n);
    std::memcpy(b_.data() + at, p, n);
  }
  std::vector<uint8_t> take() { return std::move(b_); }

 private:
  std::vector<uint8_t> b_;
};

// Every read checks the remaining length; `ok` turns false on the first
// short read and stays false.
class Reader {
 public:
  Reader(std::span<const uint8_t> h, MsgType t) : h_(h) { ok_ = !h.empty() && h[0] == uint8_t(t); pos_ = 1; }
  bool raw(void* p, size_t n) {
    if (!ok_ || h_.size() - pos_ < n) return ok_ = false;
    std::memcpy(p, h_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  uint8_t u8() { uint8_t v = 0; raw(&v, 1); return v; }
  uint32_t u32() { uint32_t v = 0; raw(&v, 4); return v; }
  int32_t i32() { int32_t v = 0; raw(&v, 4); return v; }
  uint64_t u64() { uint64_t v = 0; raw(&v, 8); return v; }
  std::string str() {
    const uint32_t n = u32();
    if (!ok_ || h_.size() - pos_ < n) { ok_ = false; return {}; }
    std::string s(reinterpret_cast<const char*>(h_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  size_t left() const { return h_.size() - pos_; }
  // All fields read and nothing left over.
  bool done() const { return ok_ && pos_ == h_.size(); }

 private:
  std::span<const uint8_t> h_;
  size_t pos_ = 0;
  bool ok_ = false;
};

void put_identity(Writer& w, const KvIdentity& id) {
  w.u32(id.version);
  w.str(id.model);
  w.str(id.kv_type);
  w.str(id.layout);
  w.i32(id.block_size);
  w.i32(id.n_layers);
  w.i32(id.n_kv_heads);
  w.i32(id.head_dim);
  w.u64(id.block_bytes);
  w.u64(id.residual_floats);
}

KvIdentity get_identity(Reader& r) {
  KvIdentity id;
  id.version = r.u32();
  id.model = r.str();
  id.kv_type = r.str();
  id.layout = r.str();
  id.block_size = r.i32();
  id.n_layers = r.i32();
  id.n_kv_heads = r.i32();
  id.head_dim = r.i32();
  id.block_bytes = r.u64();
  id.residual_floats = r.u64();
  return id;
}

}  // namespace

std::vector<uint8_t> encode_hello(const KvIdentity& id) {
  Writer w(MsgType::Hello);
  put_identity(w, id);
  return w.take();
}

std::vector<uint8_t> encode(const HelloReply& m) {
  Writer w(MsgType::HelloReply);
  w.u8(m.ok);
  w.str(m.reason);
  put_identity(w, m.identity);
  return w.take();
}

std::vector<uint8_t> encode(const Offer& m) {
  Writer w(MsgType::Offer);
  w.u64(m.xfer);
  w.raw(m.scope.bytes.data(), m.scope.bytes.size());
  w.i32(m.first_token);
  w.u32(uint32_t(m.tokens.size()));
  w.raw(m.tokens.data(), m.tokens.size() * sizeof(int32_t));
  w.u32(uint32_t(m.keys.size()));
  for (const BlockKey& k : m.keys) w.raw(k.data(), k.size());
  return w.take();
}

std::vector<uint8_t> encode(const Answer& m) {
  Writer w(MsgType::Answer);
  w.u64(m.xfer);
  w.u8(uint8_t(m.kind));
  w.u32(m.from);
  w.u32(m.to);
  w.u32(m.retry_after_ms);
  w.str(m.reason);
  return w.take();
}

std::vector<uint8_t> encode(const BlockHeader& m) {
  Writer w(MsgType::Block);
  w.u64(m.xfer);
  w.u32(m.index);
  return w.take();
}

std::vector<uint8_t> encode(const DoneHeader& m) {
  Writer w(MsgType::Done);
  w.u64(m.xfer);
  w.u32(m.blocks);
  return w.take();
}

std::vector<uint8_t> encode(const Result& m) {
  Writer w(MsgType::Result);
  w.u64(m.xfer);
  w.u8(m.ok);
  w.u64(m.handle);
  w.str(m.reason);
  return w.take();
}

std::optional<MsgType> peek_type(std::span<const uint8_t> h) {
  if (h.empty() || h[0] < uint8_t(MsgType::Hello) || h[0] > uint8_t(MsgType::Result)) return std::nullopt;
  return MsgType(h[0]);
}

std::optional<KvIdentity> decode_hello(std::span<const uint8_t> h) {
  Reader r(h, MsgType::Hello);
  KvIdentity id = get_identity(r);
  if (!r.done()) return std::nullopt;
  return id;
}

std::optional<HelloReply> decode_hello_reply(std::span<const uint8_t> h) {
  Reader r(h, MsgType::HelloReply);
  HelloReply m;
  const uint8_t ok = r.u8();
  m.ok = ok == 1;
  m.reason = r.str();
  m.identity = get_identity(r);
  if (!r.done() || ok > 1) return std::nullopt;
  return m;
}

std::optional<Offer> decode_offer(std::span<const uint8_t> h) {
  Reader r(h, MsgType::Offer);
  Offer m;
  m.xfer = r.u64();
  r.raw(m.scope.bytes.data(), m.scope.bytes.size());
  m.first_token = r.i32();
  const uint32_t n = r.u32();
  if (r.left() < size_t(n) * sizeof(int32_t)) return std::nullopt;
  m.tokens.resize(n);
  r.raw(m.tokens.data(), size_t(n) * sizeof(int32_t));
  const uint32_t nk = r.u32();
  if (r.left() != size_t(nk) * sizeof(BlockKey)) return std::nullopt;
  m.keys.resize(nk);
  for (BlockKey& k : m.keys) r.raw(k.data(), k.size());
  if (!r.done() || m.tokens.empty()) return std::nullopt;
  return m;
}

std::optional<Answer> decode_answer(std::span<const uint8_t> h) {
  Reader r(h, MsgType::Answer);
  Answer m;
  m.xfer = r.u64();
  const uint8_t kind = r.u8();
  m.from = r.u32();
  m.to = r.u32();
  m.retry_after_ms = r.u32();
  m.reason = r.str();
  if (!r.done() || kind < uint8_t(AnswerKind::Send) || kind > uint8_t(AnswerKind::Refused) || m.from > m.to)
    return std::nullopt;
  m.kind = AnswerKind(kind);
  return m;
}

std::optional<BlockHeader> decode_block(std::span<const uint8_t> h) {
  Reader r(h, MsgType::Block);
  BlockHeader m;
  m.xfer = r.u64();
  m.index = r.u32();
  if (!r.done()) return std::nullopt;
  return m;
}

std::optional<DoneHeader> decode_done(std::span<const uint8_t> h) {
  Reader r(h, MsgType::Done);
  DoneHeader m;
  m.xfer = r.u64();
  m.blocks = r.u32();
  if (!r.done()) return std::nullopt;
  return m;
}

std::optional<Result> decode_result(std::span<const uint8_t> h) {
  Reader r(h, MsgType::Result);
  Result m;
  m.xfer = r.u64();
  const uint8_t ok = r.u8();
  m.ok = ok == 1;
  m.handle = r.u64();
  m.reason = r.str();
  if (!r.done() || ok > 1) return std::nullopt;
  return m;
}

}  // namespace kvs::disagg
