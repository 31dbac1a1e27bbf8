// GGUF v2/v3 reader (mmap). Every offset and size is validated against the
// file length before use; problems throw ModelError naming the file and the
// key or tensor involved.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>
#include "kernels/quant.h"

namespace kvs {

class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
// Any of the eight integer types (reader, writer and vocab checks agree).
bool gguf_is_integer(GgufType t);

struct GgufArray;
// Scalars are widened: all unsigned ints -> uint64_t, signed -> int64_t,
// floats -> double; `type` keeps the on-disk type.
struct GgufValue {
  GgufType type = GgufType::UINT32;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>> v;

  bool is_array() const { return type == GgufType::ARRAY; }
  bool is_string() const { return type == GgufType::STRING; }
  // Conversions throw std::runtime_error on a type that does not convert.
  uint64_t as_u64() const;
  int64_t as_i64() const;
  bool is_signed_negative() const;  // a signed integer below zero
  double as_f64() const;
  bool as_bool() const;
  const std::string& as_str() const;
  const GgufArray& as_arr() const;
};

struct GgufArray {
  GgufType elem_type = GgufType::UINT32;
  std::vector<GgufValue> items;  // for STRING/numeric arrays alike
  // Fast typed views filled for the common big arrays (vocab):
  std::vector<std::string> strings;  // when elem_type == STRING (items left empty)
  std::vector<float> f32;            // when elem_type == FLOAT32 (items left empty)
  std::vector<int64_t> ints;         // when elem_type is any integer type (items left empty)
  size_t size() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous (row) length
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;        // relative to the data section
  const uint8_t* data = nullptr;  // into the mapping, validated
  size_t nbytes = 0;
  int64_t n_elements() const;
};

class GgufFile {
 public:
  // Opens and validates `path`; throws ModelError on any problem.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses an in-memory buffer (used by the fuzzer); the buffer must outlive the object.
  static std::unique_ptr<GgufFile> parse(const uint8_t* data, size_t size, const std::string& name);
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufValue* find(const std::string& key) const;
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // Typed getters: throw ModelError "<file>: key '<key>' missing/has type X, expected Y".
  uint64_t get_u64(const std::string& key) const;
  double get_f64(const std::string& key) const;
  std::string get_str(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::optional<uint64_t> opt_u64(const std::string& key) const;
  std::optional<double> opt_f64(const std::string& key) const;
  std::optional<std::string> opt_str(const std::string& key) const;
  std::optional<bool> opt_bool(const std::string& key) const;
  // Throws ModelError if missing or dims differ from `dims` (ggml order).
  const GgufTensorInfo& tensor(const std::string& name, const std::vector<int64_t>& dims) const;

 private:
  GgufFile() = default;
  std::string path_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  friend class GgufParser;
};

}  // namespace kvs
