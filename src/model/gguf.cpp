// GGUF v2/v3 reader. The file is mmapped read-only; every count, length and
// offset read from it is checked against the bytes that remain before it is
// used, so a truncated or hostile file produces a ModelError, never an
// out-of-bounds read or an allocation sized by a lying count.
#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <sstream>

namespace kvs {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr int kMaxArrayDepth = 8;           // nested arrays deeper than this are hostile
constexpr uint64_t kMaxAlignment = 1u << 20;

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "UINT8";
    case GgufType::INT8: return "INT8";
    case GgufType::UINT16: return "UINT16";
    case GgufType::INT16: return "INT16";
    case GgufType::UINT32: return "UINT32";
    case GgufType::INT32: return "INT32";
    case GgufType::FLOAT32: return "FLOAT32";
    case GgufType::BOOL: return "BOOL";
    case GgufType::STRING: return "STRING";
    case GgufType::ARRAY: return "ARRAY";
    case GgufType::UINT64: return "UINT64";
    case GgufType::INT64: return "INT64";
    case GgufType::FLOAT64: return "FLOAT64";
  }
  return "?";
}

// On-disk size of a fixed-size scalar type; 0 for STRING/ARRAY/unknown.
size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    default: return 0;
  }
}

bool valid_gguf_type(uint32_t raw) { return raw <= static_cast<uint32_t>(GgufType::FLOAT64); }

std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

bool gguf_is_integer(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
    case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64:
      return true;
    default:
      return false;
  }
}

// ---- GgufValue ---------------------------------------------------------------

uint64_t GgufValue::as_u64() const {
  if (auto p = std::get_if<uint64_t>(&v)) return *p;
  if (auto p = std::get_if<int64_t>(&v)) {
    if (*p >= 0) return static_cast<uint64_t>(*p);
    throw std::runtime_error("negative value " + std::to_string(*p) + " where an unsigned integer is expected");
  }
  throw std::runtime_error(std::string("value of type ") + gguf_type_name(type) + " is not an integer");
}

bool GgufValue::is_signed_negative() const {
  const auto* p = std::get_if<int64_t>(&v);
  return p && *p < 0;
}

int64_t GgufValue::as_i64() const {
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  if (auto p = std::get_if<uint64_t>(&v)) {
    if (*p <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(*p);
    throw std::runtime_error("value " + std::to_string(*p) + " does not fit a signed 64-bit integer");
  }
  throw std::runtime_error(std::string("value of type ") + gguf_type_name(type) + " is not an integer");
}

double GgufValue::as_f64() const {
  if (auto p = std::get_if<double>(&v)) return *p;
  if (auto p = std::get_if<uint64_t>(&v)) return static_cast<double>(*p);
  if (auto p = std::get_if<int64_t>(&v)) return static_cast<double>(*p);
  throw std::runtime_error(std::string("value of type ") + gguf_type_name(type) + " is not a number");
}

bool GgufValue::as_bool() const {
  if (auto p = std::get_if<bool>(&v)) return *p;
  throw std::runtime_error(std::string("value of type ") + gguf_type_name(type) + " is not a bool");
}

const std::string& GgufValue::as_str() const {
  if (auto p = std::get_if<std::string>(&v)) return *p;
  throw std::runtime_error(std::string("value of type ") + gguf_type_name(type) + " is not a string");
}

const GgufArray& GgufValue::as_arr() const {
  if (auto p = std::get_if<std::shared_ptr<GgufArray>>(&v); p && *p) return **p;
  throw std::runtime_error(std::string("value of type ") + gguf_type_name(type) + " is not an array");
}

size_t GgufArray::size() const {
  if (elem_type == GgufType::STRING) return strings.size();
  if (elem_type == GgufType::FLOAT32) return f32.size();
  if (gguf_is_integer(elem_type)) return ints.size();
  return items.size();
}

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// ---- parser ------------------------------------------------------------------

class GgufParser {
 public:
  GgufParser(GgufFile& f, const uint8_t* data, size_t size) : f_(f), p_(data), size_(size) {}

  void run() {
    const uint32_t magic = u32("magic");
    if (magic != kGgufMagic) {
      char m[5] = {};
      std::memcpy(m, p_, 4);
      for (char& c : m)
        if (c && (c < 32 || c > 126)) c = '?';
      fail("not a GGUF file (magic '" + std::string(m) + "', expected 'GGUF')");
    }
    const uint32_t version = u32("version");
    if (version == 1) fail("GGUF version 1 is not supported (only v2 and v3); re-convert the model");
    if (version != 2 && version != 3) {
      // A byte-swapped 2/3 means a big-endian file.
      if (version == 0x02000000u || version == 0x03000000u) fail("big-endian GGUF files are not supported");
      fail("unsupported GGUF version " + std::to_string(version) + " (expected 2 or 3)");
    }
    f_.version_ = version;
    const uint64_t n_tensors = u64("tensor count");
    const uint64_t n_kv = u64("metadata count");
    // A tensor info takes >= 24 bytes (name length, n_dims, type, offset) and
    // a key/value >= 13 (key length, type, 1-byte value): a count larger than
    // the remaining bytes allow is a lie, rejected before allocating for it.
    if (n_kv > remaining() / 13)
      fail("metadata count " + std::to_string(n_kv) + " is impossible for the " +
           std::to_string(remaining()) + " bytes left in the file");
    if (n_tensors > remaining() / 24)
      fail("tensor count " + std::to_string(n_tensors) + " is impossible for the " +
           std::to_string(remaining()) + " bytes left in the file");

    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str("metadata key #" + std::to_string(i));
      const uint32_t raw = u32("type of key '" + key + "'");
      if (!valid_gguf_type(raw)) fail("key '" + key + "': unknown value type " + std::to_string(raw));
      GgufValue val = value(static_cast<GgufType>(raw), key, 0);
      if (!f_.kv_.emplace(key, std::move(val)).second) fail("duplicate metadata key '" + key + "'");
    }

    f_.alignment_ = 32;
    if (const GgufValue* a = f_.find("general.alignment")) {
      if (!gguf_is_integer(a->type)) fail("key 'general.alignment' has type " + std::string(gguf_type_name(a->type)) + ", expected UINT32");
      // An unsigned value past INT64_MAX is as invalid as any other: checked
      // unsigned first so that it fails here with the key named.
      const bool neg = a->is_signed_negative();
      const uint64_t al = neg ? 0 : a->as_u64();
      if (neg || al == 0 || (al & (al - 1)) != 0 || al > kMaxAlignment)
        fail("key 'general.alignment' = " + (neg ? std::to_string(a->as_i64()) : std::to_string(al)) +
             " is not a power of two in [1, 2^20]");
      f_.alignment_ = static_cast<size_t>(al);
    }

    // Reservations are capped: a count is only bounded by the file size, and
    // per-element structures are larger than their encoding.
    f_.tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, 4096)));
    for (uint64_t i = 0; i < n_tensors; ++i) f_.tensors_.push_back(tensor_info(i));

    // Data section: first multiple of the alignment after the infos. A
    // vocab-only file may end before it (no padding), which is fine.
    const uint64_t data_start = (pos_ + f_.alignment_ - 1) / f_.alignment_ * f_.alignment_;
    for (size_t i = 0; i < f_.tensors_.size(); ++i) {
      GgufTensorInfo& t = f_.tensors_[i];
      if (!f_.tensor_index_.emplace(t.name, i).second) fail("duplicate tensor name '" + t.name + "'");
      if (t.offset % f_.alignment_ != 0)
        fail("tensor '" + t.name + "': offset " + std::to_string(t.offset) +
             " is not a multiple of the alignment " + std::to_string(f_.alignment_));
      // Written as subtractions so huge offsets cannot wrap around.
      if (data_start > size_ || t.offset > size_ - data_start || t.nbytes > size_ - data_start - t.offset) {
        const unsigned __int128 off = static_cast<unsigned __int128>(data_start) + t.offset;
        fail("tensor '" + t.name + "': data [" + u128_str(off) + ", " + u128_str(off + t.nbytes) +
             ") past end of file (size " + std::to_string(size_) + ")");
      }
      t.data = p_ + data_start + t.offset;
    }
  }

 private:
  GgufFile& f_;
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;

  static std::string u128_str(unsigned __int128 v) {
    if (v == 0) return "0";
    std::string s;
    while (v) {
      s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
      v /= 10;
    }
    return s;
  }

  [[noreturn]] void fail(const std::string& msg) const { throw ModelError(f_.path_ + ": " + msg); }

  size_t remaining() const { return size_ - pos_; }

  // Ensures n more bytes exist; `what` names the field for the message.
  void need(uint64_t n, const std::string& what) const {
    if (n > remaining())
      fail(what + ": needs " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
           " but the file ends at " + std::to_string(size_) + " (truncated?)");
  }

  template <class T>
  T raw(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint32_t u32(const std::string& what) { return raw<uint32_t>(what); }
  uint64_t u64(const std::string& what) { return raw<uint64_t>(what); }

  std::string str(const std::string& what) {
    const uint64_t len = u64(what + " length");
    if (len > remaining())
      fail(what + ": string length " + std::to_string(len) + " exceeds the " +
           std::to_string(remaining()) + " bytes left in the file");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

  // One scalar of fixed-size type t at the cursor (bounds already checked).
  GgufValue scalar_at(GgufType t) {
    GgufValue out;
    out.type = t;
    const uint8_t* q = p_ + pos_;
    auto rd = [&](auto dummy) {
      decltype(dummy) x;
      std::memcpy(&x, q, sizeof x);
      pos_ += sizeof x;
      return x;
    };
    switch (t) {
      case GgufType::UINT8: out.v = uint64_t(rd(uint8_t{})); break;
      case GgufType::INT8: out.v = int64_t(rd(int8_t{})); break;
      case GgufType::UINT16: out.v = uint64_t(rd(uint16_t{})); break;
      case GgufType::INT16: out.v = int64_t(rd(int16_t{})); break;
      case GgufType::UINT32: out.v = uint64_t(rd(uint32_t{})); break;
      case GgufType::INT32: out.v = int64_t(rd(int32_t{})); break;
      case GgufType::UINT64: out.v = uint64_t(rd(uint64_t{})); break;
      case GgufType::INT64: out.v = int64_t(rd(int64_t{})); break;
      case GgufType::FLOAT32: out.v = double(rd(float{})); break;
      case GgufType::FLOAT64: out.v = rd(double{}); break;
      case GgufType::BOOL: {
        const uint8_t b = rd(uint8_t{});
        if (b > 1) fail("bool value " + std::to_string(b) + " is neither 0 nor 1");
        out.v = b != 0;
        break;
      }
      default: fail("internal: scalar_at on a non-scalar type");
    }
    return out;
  }

  GgufValue value(GgufType t, const std::string& key, int depth) {
    if (t == GgufType::STRING) {
      GgufValue out;
      out.type = t;
      out.v = str("key '" + key + "'");
      return out;
    }
    if (t == GgufType::ARRAY) return array(key, depth);
    need(scalar_size(t), "key '" + key + "'");
    return scalar_at(t);
  }

  GgufValue array(const std::string& key, int depth) {
    if (depth >= kMaxArrayDepth) fail("key '" + key + "': arrays nested deeper than " + std::to_string(kMaxArrayDepth));
    const uint32_t raw_et = u32("key '" + key + "' array element type");
    if (!valid_gguf_type(raw_et)) fail("key '" + key + "': unknown array element type " + std::to_string(raw_et));
    const GgufType et = static_cast<GgufType>(raw_et);
    const uint64_t n = u64("key '" + key + "' array length");
    // Smallest possible encoding of one element: bounds the count by what is left.
    const size_t min_elem = et == GgufType::STRING ? 8 : et == GgufType::ARRAY ? 12 : scalar_size(et);
    if (n > remaining() / min_elem)
      fail("key '" + key + "': array length " + std::to_string(n) + " of " + gguf_type_name(et) +
           " exceeds the " + std::to_string(remaining()) + " bytes left in the file");
    auto arr = std::make_shared<GgufArray>();
    arr->elem_type = et;
    const size_t count = static_cast<size_t>(n);
    if (et == GgufType::STRING) {
      // Vocabularies hold 50k-150k strings: read them straight into the typed view.
      arr->strings.reserve(std::min<size_t>(count, 1u << 20));
      for (size_t i = 0; i < count; ++i) {
        // Inline bounds checks: building a message per element would dominate.
        if (remaining() < 8) need(8, "key '" + key + "' string #" + std::to_string(i) + " length");
        uint64_t len;
        std::memcpy(&len, p_ + pos_, 8);
        pos_ += 8;
        if (len > remaining())
          fail("key '" + key + "': string #" + std::to_string(i) + " length " + std::to_string(len) +
               " exceeds the " + std::to_string(remaining()) + " bytes left in the file");
        arr->strings.emplace_back(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
        pos_ += len;
      }
    } else if (et == GgufType::FLOAT32) {
      arr->f32.resize(count);
      if (count) std::memcpy(arr->f32.data(), p_ + pos_, count * 4);  // data() may be null when empty
      pos_ += count * 4;
    } else if (gguf_is_integer(et)) {
      // int64 per element can be 8x the encoding (UINT8): grow as read.
      arr->ints.reserve(std::min<size_t>(count, 1u << 20));
      for (size_t i = 0; i < count; ++i) {
        const GgufValue s = scalar_at(et);
        // UINT64 values above INT64_MAX wrap; no real metadata needs them.
        arr->ints.push_back(std::holds_alternative<uint64_t>(s.v) ? static_cast<int64_t>(std::get<uint64_t>(s.v))
                                                                 : std::get<int64_t>(s.v));
      }
    } else {
      arr->items.reserve(std::min<size_t>(count, 4096));
      for (size_t i = 0; i < count; ++i) arr->items.push_back(value(et, key, depth + 1));
    }
    GgufValue out;
    out.type = GgufType::ARRAY;
    out.v = std::move(arr);
    return out;
  }

  GgufTensorInfo tensor_info(uint64_t i) {
    GgufTensorInfo t;
    t.name = str("tensor #" + std::to_string(i) + " name");
    const std::string tn = "tensor '" + t.name + "'";
    const uint32_t n_dims = u32(tn + " n_dims");
    if (n_dims == 0 || n_dims > 4) fail(tn + ": n_dims " + std::to_string(n_dims) + " (expected 1..4)");
    unsigned __int128 n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = u64(tn + " dim " + std::to_string(d));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(tn + ": dimension " + std::to_string(d) + " = " + std::to_string(dim) + " is out of range");
      t.dims.push_back(static_cast<int64_t>(dim));
      n *= dim;
      if (n > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max()))
        fail(tn + ": element count of shape overflows (dims " + dims_str(t.dims) + "...)");
    }
    const uint32_t type = u32(tn + " type");
    if (!is_known_type(type)) fail(tn + ": unknown ggml tensor type id " + std::to_string(type));
    t.type = static_cast<GgmlType>(type);
    t.offset = u64(tn + " offset");
    const TypeTraits& tt = type_traits(t.type);
    if (t.dims[0] % tt.block_elems != 0)
      fail(tn + ": row length " + std::to_string(t.dims[0]) + " is not a multiple of the " + tt.name +
           " block size " + std::to_string(tt.block_elems));
    const unsigned __int128 bytes = n / tt.block_elems * tt.block_bytes;
    if (bytes > size_)
      fail(tn + ": " + dims_str(t.dims) + " of " + tt.name + " needs " + u128_str(bytes) +
           " bytes, more than the whole file (size " + std::to_string(size_) + ")");
    t.nbytes = static_cast<size_t>(bytes);
    return t;
  }
};

// ---- GgufFile ----------------------------------------------------------------

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ModelError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw ModelError(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ModelError(path + (S_ISDIR(st.st_mode) ? ": is a directory; pass the .gguf file itself" : ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    throw ModelError(path + ": empty file (expected GGUF)");
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) throw ModelError(path + ": mmap failed: " + std::strerror(e));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->map_ = m;
  f->map_size_ = size;
  GgufParser(*f, static_cast<const uint8_t*>(m), size).run();  // on throw, ~GgufFile unmaps
  return f;
}

std::unique_ptr<GgufFile> GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  if (data == nullptr && size != 0) throw ModelError(name + ": null buffer");
  static const uint8_t empty = 0;
  GgufParser(*f, data ? data : &empty, size).run();
  return f;
}

GgufFile::~GgufFile() {
  if (map_) munmap(map_, map_size_);
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

template <class T, class F>
std::optional<T> typed(const GgufFile& f, const std::string& key, const char* expected, F conv) {
  const GgufValue* v = f.find(key);
  if (!v) return std::nullopt;
  try {
    return conv(*v);
  } catch (const std::runtime_error& e) {
    throw ModelError(f.path() + ": key '" + key + "' has type " + gguf_type_name(v->type) + ", expected " +
                     expected + " (" + e.what() + ")");
  }
}

[[noreturn]] void missing(const GgufFile& f, const std::string& key) {
  throw ModelError(f.path() + ": required key '" + key + "' is missing");
}

}  // namespace

std::optional<uint64_t> GgufFile::opt_u64(const std::string& key) const {
  return typed<uint64_t>(*this, key, "an unsigned integer", [](const GgufValue& v) { return v.as_u64(); });
}
std::optional<double> GgufFile::opt_f64(const std::string& key) const {
  return typed<double>(*this, key, "a number", [](const GgufValue& v) { return v.as_f64(); });
}
std::optional<std::string> GgufFile::opt_str(const std::string& key) const {
  return typed<std::string>(*this, key, "STRING", [](const GgufValue& v) { return v.as_str(); });
}
std::optional<bool> GgufFile::opt_bool(const std::string& key) const {
  return typed<bool>(*this, key, "BOOL", [](const GgufValue& v) { return v.as_bool(); });
}

uint64_t GgufFile::get_u64(const std::string& key) const {
  if (auto v = opt_u64(key)) return *v;
  missing(*this, key);
}
double GgufFile::get_f64(const std::string& key) const {
  if (auto v = opt_f64(key)) return *v;
  missing(*this, key);
}
std::string GgufFile::get_str(const std::string& key) const {
  if (auto v = opt_str(key)) return *v;
  missing(*this, key);
}
bool GgufFile::get_bool(const std::string& key) const {
  if (auto v = opt_bool(key)) return *v;
  missing(*this, key);
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name, const std::vector<int64_t>& dims) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) throw ModelError(path_ + ": tensor '" + name + "' is missing");
  if (t->dims != dims)
    throw ModelError(path_ + ": tensor '" + name + "' has shape " + dims_str(t->dims) + ", expected " +
                     dims_str(dims) + " (ggml order: row length first)");
  return *t;
}

}  // namespace kvs
