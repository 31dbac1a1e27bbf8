// GGUF v3 writer. Layout: header, key/values in insertion order, tensor
// infos, padding to the alignment, then each tensor's data padded to the
// alignment. Written to a temporary file and renamed, so a reader never
// sees a half-written model.
#include "model/gguf_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

namespace kvs {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"

template <class T>
GgufValue make(GgufType t, T v) {
  GgufValue out;
  out.type = t;
  out.v = v;
  return out;
}

// Buffered output that remembers the path for error messages.
class Out {
 public:
  Out(const std::string& tmp, const std::string& final_path) : tmp_(tmp), path_(final_path) {
    f_ = std::fopen(tmp.c_str(), "wb");
    if (!f_) throw ModelError(path_ + ": cannot create " + tmp + ": " + std::strerror(errno));
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  ~Out() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  void bytes(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) throw ModelError(path_ + ": write failed: " + std::strerror(errno));
    pos_ += n;
  }
  template <class T>
  void pod(T v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad(size_t align) {
    static const uint8_t zeros[4096] = {};
    size_t n = (align - pos_ % align) % align;
    while (n) {
      const size_t k = std::min(n, sizeof zeros);
      bytes(zeros, k);
      n -= k;
    }
  }
  uint64_t pos() const { return pos_; }
  // Flushes, syncs and renames over the destination.
  void commit() {
    if (std::fflush(f_) != 0 || fsync(fileno(f_)) != 0)
      throw ModelError(path_ + ": flush failed: " + std::strerror(errno));
    if (std::fclose(f_) != 0) {
      f_ = nullptr;
      std::remove(tmp_.c_str());
      throw ModelError(path_ + ": close failed: " + std::strerror(errno));
    }
    f_ = nullptr;
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int e = errno;
      std::remove(tmp_.c_str());
      throw ModelError(path_ + ": rename from " + tmp_ + " failed: " + std::strerror(e));
    }
  }

 private:
  std::FILE* f_ = nullptr;
  std::string tmp_, path_;
  uint64_t pos_ = 0;
};

// Writes one integer of on-disk type t, checking that it fits.
void put_int(Out& o, GgufType t, int64_t sv, uint64_t uv, bool is_signed, const std::string& key) {
  auto range = [&](int64_t lo, uint64_t hi) {
    const bool ok = is_signed ? (sv >= lo && (sv < 0 || static_cast<uint64_t>(sv) <= hi))
                              : uv <= hi;
    if (!ok) throw ModelError("gguf writer: key '" + key + "': value out of range for its type");
  };
  const int64_t s = is_signed ? sv : static_cast<int64_t>(uv);
  switch (t) {
    case GgufType::UINT8: range(0, 0xFF); o.pod<uint8_t>(static_cast<uint8_t>(s)); break;
    case GgufType::INT8: range(-128, 127); o.pod<int8_t>(static_cast<int8_t>(s)); break;
    case GgufType::UINT16: range(0, 0xFFFF); o.pod<uint16_t>(static_cast<uint16_t>(s)); break;
    case GgufType::INT16: range(-32768, 32767); o.pod<int16_t>(static_cast<int16_t>(s)); break;
    case GgufType::UINT32: range(0, 0xFFFFFFFFu); o.pod<uint32_t>(static_cast<uint32_t>(s)); break;
    case GgufType::INT32: range(INT32_MIN, INT32_MAX); o.pod<int32_t>(static_cast<int32_t>(s)); break;
    case GgufType::UINT64:
      range(0, std::numeric_limits<uint64_t>::max());
      o.pod<uint64_t>(is_signed ? static_cast<uint64_t>(sv) : uv);
      break;
    case GgufType::INT64:
      range(INT64_MIN, static_cast<uint64_t>(INT64_MAX));
      o.pod<int64_t>(s);
      break;
    default: throw ModelError("gguf writer: key '" + key + "': internal: not an integer type");
  }
}

void put_value(Out& o, const GgufValue& v, const std::string& key, bool with_type);

void put_scalar(Out& o, const GgufValue& v, const std::string& key) {
  try {
    if (gguf_is_integer(v.type)) {
      if (auto p = std::get_if<int64_t>(&v.v)) put_int(o, v.type, *p, 0, true, key);
      else put_int(o, v.type, 0, v.as_u64(), false, key);
    } else if (v.type == GgufType::FLOAT32) {
      o.pod<float>(static_cast<float>(v.as_f64()));
    } else if (v.type == GgufType::FLOAT64) {
      o.pod<double>(v.as_f64());
    } else if (v.type == GgufType::BOOL) {
      o.pod<uint8_t>(v.as_bool() ? 1 : 0);
    } else if (v.type == GgufType::STRING) {
      o.str(v.as_str());
    } else {
      throw ModelError("gguf writer: key '" + key + "': unknown value type");
    }
  } catch (const ModelError&) {
    throw;
  } catch (const std::exception& e) {
    throw ModelError("gguf writer: key '" + key + "': " + e.what());
  }
}

void put_array(Out& o, const GgufArray& a, const std::string& key) {
  o.pod<uint32_t>(static_cast<uint32_t>(a.elem_type));
  o.pod<uint64_t>(a.size());
  // Typed views when they hold the data (as the reader fills them), else items.
  if (a.elem_type == GgufType::STRING && !a.strings.empty()) {
    for (const auto& s : a.strings) o.str(s);
  } else if (a.elem_type == GgufType::FLOAT32 && !a.f32.empty()) {
    o.bytes(a.f32.data(), a.f32.size() * 4);
  } else if (gguf_is_integer(a.elem_type) && !a.ints.empty()) {
    for (int64_t x : a.ints) {
      // UINT64 stores wrapped values (see the reader); write the bits back.
      if (a.elem_type == GgufType::UINT64) o.pod<uint64_t>(static_cast<uint64_t>(x));
      else put_int(o, a.elem_type, x, 0, true, key);
    }
  } else {
    for (const auto& it : a.items) {
      if (it.type != a.elem_type) throw ModelError("gguf writer: key '" + key + "': array item type differs from element type");
      put_value(o, it, key, false);
    }
  }
}

size_t array_size_check(const GgufArray& a) {
  // size() picks the view by element type; the others must be empty or it
  // would silently drop data.
  const size_t typed = a.strings.size() + a.f32.size() + a.ints.size();
  if (typed && !a.items.empty()) throw ModelError("gguf writer: array has both typed and generic items");
  return typed ? typed : a.items.size();
}

void put_value(Out& o, const GgufValue& v, const std::string& key, bool with_type) {
  if (with_type) o.pod<uint32_t>(static_cast<uint32_t>(v.type));
  if (v.type == GgufType::ARRAY) {
    const GgufArray& a = v.as_arr();
    if (array_size_check(a) != a.size())
      throw ModelError("gguf writer: key '" + key + "': array data does not match its element type");
    put_array(o, a, key);
  } else {
    put_scalar(o, v, key);
  }
}

uint64_t tensor_bytes(GgmlType type, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return dims[0] == 0 ? 0 : row_bytes(type, dims[0]) * static_cast<uint64_t>(n / dims[0]);
}

}  // namespace

void GgufWriter::put(const std::string& key, GgufValue v) {
  for (auto& kv : kv_)
    if (kv.key == key) {
      kv.value = std::move(v);  // overwrite keeps the original position
      return;
    }
  kv_.push_back({key, std::move(v)});
}

void GgufWriter::set_u32(const std::string& key, uint32_t v) { put(key, make(GgufType::UINT32, uint64_t(v))); }
void GgufWriter::set_i32(const std::string& key, int32_t v) { put(key, make(GgufType::INT32, int64_t(v))); }
void GgufWriter::set_u64(const std::string& key, uint64_t v) { put(key, make(GgufType::UINT64, v)); }
void GgufWriter::set_f32(const std::string& key, float v) { put(key, make(GgufType::FLOAT32, double(v))); }
void GgufWriter::set_bool(const std::string& key, bool v) { put(key, make(GgufType::BOOL, v)); }
void GgufWriter::set_str(const std::string& key, const std::string& v) { put(key, make(GgufType::STRING, v)); }
void GgufWriter::set_value(const std::string& key, const GgufValue& v) { put(key, v); }

void GgufWriter::set_str_array(const std::string& key, const std::vector<std::string>& v) {
  auto a = std::make_shared<GgufArray>();
  a->elem_type = GgufType::STRING;
  a->strings = v;
  put(key, make(GgufType::ARRAY, a));
}

void GgufWriter::set_f32_array(const std::string& key, const std::vector<float>& v) {
  auto a = std::make_shared<GgufArray>();
  a->elem_type = GgufType::FLOAT32;
  a->f32 = v;
  put(key, make(GgufType::ARRAY, a));
}

void GgufWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  auto a = std::make_shared<GgufArray>();
  a->elem_type = GgufType::INT32;
  a->ints.assign(v.begin(), v.end());
  put(key, make(GgufType::ARRAY, a));
}

void GgufWriter::check_new_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& dims) const {
  if (name.empty()) throw ModelError("gguf writer: empty tensor name");
  if (dims.empty() || dims.size() > 4)
    throw ModelError("gguf writer: tensor '" + name + "': " + std::to_string(dims.size()) + " dims (expected 1..4)");
  for (int64_t d : dims)
    if (d < 0) throw ModelError("gguf writer: tensor '" + name + "': negative dimension");
  if (!is_known_type(static_cast<uint32_t>(type)))
    throw ModelError("gguf writer: tensor '" + name + "': unknown type id " + std::to_string(static_cast<uint32_t>(type)));
  if (dims[0] % type_traits(type).block_elems != 0)
    throw ModelError("gguf writer: tensor '" + name + "': row length " + std::to_string(dims[0]) +
                     " is not a multiple of the " + type_name(type) + " block size");
  for (const auto& t : tensors_)
    if (t.name == name) throw ModelError("gguf writer: duplicate tensor '" + name + "'");
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& dims,
                            std::vector<uint8_t> data) {
  check_new_tensor(name, type, dims);
  const uint64_t want = tensor_bytes(type, dims);
  if (data.size() != want)
    throw ModelError("gguf writer: tensor '" + name + "': " + std::to_string(data.size()) + " bytes given, " +
                     type_name(type) + " of this shape needs " + std::to_string(want));
  tensors_.push_back({name, type, dims, std::move(data), nullptr});
}

void GgufWriter::add_tensor_f32(const std::string& name, GgmlType type, const std::vector<int64_t>& dims,
                                const float* data) {
  check_new_tensor(name, type, dims);
  std::vector<uint8_t> buf(tensor_bytes(type, dims));
  if (dims[0] > 0) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    const size_t rb = row_bytes(type, dims[0]);
    for (int64_t r = 0; r < n / dims[0]; ++r)
      quantize_row(type, data + r * dims[0], buf.data() + r * rb, dims[0]);
  }
  tensors_.push_back({name, type, dims, std::move(buf), nullptr});
}

void GgufWriter::add_tensor_rows(const std::string& name, GgmlType type, const std::vector<int64_t>& dims,
                                 RowFn row) {
  check_new_tensor(name, type, dims);
  if (!row) throw ModelError("gguf writer: tensor '" + name + "': no row function");
  tensors_.push_back({name, type, dims, {}, std::move(row)});
}

void GgufWriter::write(const std::string& path) const {
  size_t align = 32;
  for (const auto& kv : kv_)
    if (kv.key == "general.alignment") {
      uint64_t a = 0;
      try {
        a = kv.value.as_u64();
      } catch (const std::exception&) {
      }
      if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 20))
        throw ModelError(path + ": general.alignment must be a power of two in [1, 2^20]");
      align = static_cast<size_t>(a);
    }

  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  Out o(tmp, path);
  o.pod<uint32_t>(kGgufMagic);
  o.pod<uint32_t>(3);
  o.pod<uint64_t>(tensors_.size());
  o.pod<uint64_t>(kv_.size());
  for (const auto& kv : kv_) {
    o.str(kv.key);
    put_value(o, kv.value, kv.key, true);
  }
  uint64_t off = 0;
  for (const auto& t : tensors_) {
    o.str(t.name);
    o.pod<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) o.pod<uint64_t>(static_cast<uint64_t>(d));
    o.pod<uint32_t>(static_cast<uint32_t>(t.type));
    o.pod<uint64_t>(off);
    off += (tensor_bytes(t.type, t.dims) + align - 1) / align * align;
  }
  o.pad(align);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    if (t.row) {
      const int64_t cols = t.dims[0];
      int64_t n = 1;
      for (int64_t d : t.dims) n *= d;
      if (cols > 0) {
        std::vector<float> f(cols);
        std::vector<uint8_t> q(row_bytes(t.type, cols));
        for (int64_t r = 0; r < n / cols; ++r) {
          t.row(r, f.data());
          quantize_row(t.type, f.data(), q.data(), cols);
          o.bytes(q.data(), q.size());
        }
      }
    } else {
      o.bytes(t.data.data(), t.data.size());
    }
    o.pad(align);
    if (progress_) progress_(i + 1, tensors_.size(), t.name);
  }
  o.commit();
}

}  // namespace kvs
