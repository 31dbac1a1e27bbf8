#include "events/kv_event_codec.h"

#include <algorithm>
#include <msgpack.hpp>

namespace kvs::events {

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(Packer& pk, const std::string& s) {
  pk.pack_str(uint32_t(s.size()));
  pk.pack_str_body(s.data(), uint32_t(s.size()));
}

// Events [i, j) are one chain of Stored blocks: one BlockStored.
void pack_stored(Packer& pk, const std::vector<KvEvent>& ev, size_t i, size_t j, int block_size) {
  pk.pack_array(7);
  pack_str(pk, "BlockStored");
  pk.pack_array(uint32_t(j - i));
  for (size_t k = i; k < j; ++k) pk.pack_uint64(block_hash(ev[k].key));
  if (ev[i].has_parent) {
    pk.pack_uint64(block_hash(ev[i].parent));
  } else {
    pk.pack_nil();
  }
  size_t n_tokens = 0;
  for (size_t k = i; k < j; ++k) n_tokens += ev[k].tokens.size();
  pk.pack_array(uint32_t(n_tokens));
  for (size_t k = i; k < j; ++k)
    for (int32_t t : ev[k].tokens) pk.pack_int32(t);
  pk.pack_int32(block_size);
  pk.pack_nil();  // lora_id: kvserve serves no adapters
  pack_str(pk, kMedium);
}

void pack_removed(Packer& pk, const std::vector<KvEvent>& ev, size_t i, size_t j) {
  pk.pack_array(3);
  pack_str(pk, "BlockRemoved");
  pk.pack_array(uint32_t(j - i));
  for (size_t k = i; k < j; ++k) pk.pack_uint64(block_hash(ev[k].key));
  pack_str(pk, kMedium);
}

// [begin, end) runs of events that encode as one wire event each.
std::vector<std::pair<size_t, size_t>> runs(const std::vector<KvEvent>& ev) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < ev.size();) {
    size_t j = i + 1;
    if (ev[i].kind == KvEvent::Kind::Stored) {
      while (j < ev.size() && ev[j].kind == KvEvent::Kind::Stored && ev[j].has_parent && ev[j].parent == ev[j - 1].key)
        ++j;
    } else {
      while (j < ev.size() && ev[j].kind == KvEvent::Kind::Removed) ++j;
    }
    out.emplace_back(i, j);
    i = j;
  }
  return out;
}

struct DecodeError {
  std::string what;
};

const msgpack::object& at(const msgpack::object& a, uint32_t i) {
  if (a.type != msgpack::type::ARRAY || a.via.array.size <= i) throw DecodeError{"array too short"};
  return a.via.array.ptr[i];
}

uint64_t as_hash(const msgpack::object& o) {
  // vLLM's int hashes are unsigned; a signed encoder may send the same bits
  // as a negative number.
  if (o.type == msgpack::type::POSITIVE_INTEGER) return o.via.u64;
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return uint64_t(o.via.i64);
  throw DecodeError{"block hash is not an integer"};
}

std::vector<uint64_t> hash_list(const msgpack::object& o) {
  if (o.type != msgpack::type::ARRAY) throw DecodeError{"block_hashes is not an array"};
  std::vector<uint64_t> v;
  v.reserve(o.via.array.size);
  for (uint32_t i = 0; i < o.via.array.size; ++i) v.push_back(as_hash(o.via.array.ptr[i]));
  return v;
}

WireEvent decode_event(const msgpack::object& e) {
  const msgpack::object& tag = at(e, 0);
  if (tag.type != msgpack::type::STR) throw DecodeError{"event tag is not a string"};
  const std::string t(tag.via.str.ptr, tag.via.str.size);
  WireEvent w;
  if (t == "BlockStored") {
    w.kind = WireEvent::Kind::Stored;
    w.hashes = hash_list(at(e, 1));
    const msgpack::object& parent = at(e, 2);
    if (parent.type != msgpack::type::NIL) w.parent = as_hash(parent);
    if (at(e, 3).type != msgpack::type::ARRAY) throw DecodeError{"token_ids is not an array"};
    const msgpack::object& bs = at(e, 4);
    if (bs.type != msgpack::type::POSITIVE_INTEGER || bs.via.u64 == 0 || bs.via.u64 > (1u << 20))
      throw DecodeError{"block_size is not a positive integer"};
    w.block_size = int(bs.via.u64);
  } else if (t == "BlockRemoved") {
    w.kind = WireEvent::Kind::Removed;
    w.hashes = hash_list(at(e, 1));
  } else if (t == "AllBlocksCleared") {
    w.kind = WireEvent::Kind::Cleared;
  } else {
    throw DecodeError{"unknown event tag"};
  }
  return w;
}

}  // namespace

uint64_t block_hash(const BlockKey& key) {
  uint64_t h = 0;
  for (size_t i = key.size() - 8; i < key.size(); ++i) h = (h << 8) | key[i];
  return h;
}

std::string encode_batch(double ts, const std::vector<KvEvent>& events, int block_size, bool cleared, int dp_rank) {
  msgpack::sbuffer buf;
  Packer pk(&buf);
  const auto r = runs(events);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(uint32_t(r.size() + (cleared ? 1 : 0)));
  if (cleared) {
    pk.pack_array(1);
    pack_str(pk, "AllBlocksCleared");
  }
  for (const auto& [i, j] : r) {
    if (events[i].kind == KvEvent::Kind::Stored) {
      pack_stored(pk, events, i, j, block_size);
    } else {
      pack_removed(pk, events, i, j);
    }
  }
  pk.pack_int32(dp_rank);
  return std::string(buf.data(), buf.size());
}

std::optional<WireBatch> decode_batch(const void* data, size_t size, std::string* error) {
  try {
    std::size_t off = 0;
    // Every element takes at least one byte, so no count may exceed the
    // payload: a forged length cannot make the decoder allocate more.
    const size_t n = std::max<size_t>(size, 1);
    const msgpack::unpack_limit limit(n, 0, n, n, 0, 8);
    const msgpack::object_handle oh =
        msgpack::unpack(static_cast<const char*>(data), size, off, nullptr, nullptr, limit);
    if (off != size) throw DecodeError{"trailing bytes after the batch"};
    const msgpack::object& b = oh.get();
    if (b.type != msgpack::type::ARRAY || b.via.array.size < 2) throw DecodeError{"batch is not [ts, events, ...]"};
    WireBatch out;
    const msgpack::object& ts = b.via.array.ptr[0];
    if (ts.type == msgpack::type::FLOAT64 || ts.type == msgpack::type::FLOAT32) {
      out.ts = ts.via.f64;
    } else if (ts.type == msgpack::type::POSITIVE_INTEGER) {
      out.ts = double(ts.via.u64);
    } else {
      throw DecodeError{"ts is not a number"};
    }
    const msgpack::object& ev = b.via.array.ptr[1];
    if (ev.type != msgpack::type::ARRAY) throw DecodeError{"events is not an array"};
    for (uint32_t i = 0; i < ev.via.array.size; ++i) out.events.push_back(decode_event(ev.via.array.ptr[i]));
    return out;
  } catch (const DecodeError& e) {
    if (error) *error = e.what;
  } catch (const std::exception& e) {
    if (error) *error = std::string("not msgpack: ") + e.what();
  }
  return std::nullopt;
}

}  // namespace kvs::events
