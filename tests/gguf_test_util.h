// Helpers for the GGUF / model-loading tests: a raw byte builder for
// hand-made (often deliberately broken) GGUF files, file I/O, and a
// "rewrite" that copies a GGUF through the writer with edits.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace kvs::test {

// Little-endian GGUF bytes, field by field.
struct RawGguf {
  std::vector<uint8_t> b;
  template <class T>
  RawGguf& pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  RawGguf& u32(uint32_t v) { return pod(v); }
  RawGguf& u64(uint64_t v) { return pod(v); }
  RawGguf& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  RawGguf& kv_u32(const std::string& k, uint32_t v) { return str(k).u32(4).u32(v); }
  RawGguf& kv_str(const std::string& k, const std::string& v) { return str(k).u32(8).str(v); }
  // name, dims (ggml order), type id, offset
  RawGguf& tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t off) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(off);
  }
  RawGguf& pad(size_t align = 32) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  RawGguf& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Copies every key and tensor of `src` into a writer, lets `edit` change it
// (the tensor callback may rename, reshape or drop: return false to drop),
// and writes `dst`.
struct TensorCopy {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};
inline void rewrite_gguf(const std::string& src, const std::string& dst,
                         const std::function<void(GgufWriter&)>& edit_kv,
                         const std::function<bool(TensorCopy&)>& edit_tensor,
                         const std::function<bool(const std::string&)>& keep_key = nullptr) {
  auto f = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [k, v] : f->metadata())
    if (!keep_key || keep_key(k)) w.set_value(k, v);
  if (edit_kv) edit_kv(w);
  for (const auto& t : f->tensors()) {
    TensorCopy c{t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
    if (edit_tensor && !edit_tensor(c)) continue;
    w.add_tensor(c.name, c.type, c.dims, std::move(c.data));
  }
  w.write(dst);
}

// Calls `fn` and returns the ModelError message ("" if nothing was thrown).
template <class F>
std::string model_error(F&& fn) {
  try {
    fn();
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

}  // namespace kvs::test
