// GGUF v3 writer: metadata of every value type, tensors of any supported
// type, aligned per general.alignment (default 32).
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "model/gguf.h"

namespace kvs {

class GgufWriter {
 public:
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_str(const std::string& key, const std::string& v);
  void set_value(const std::string& key, const GgufValue& v);  // copy any value (incl. arrays)
  void set_str_array(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  // dims in ggml order (dims[0] contiguous). `data` holds already-encoded bytes of `type`.
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& dims,
                  std::vector<uint8_t> data);
  // Quantizes float data to `type` (rows of dims[0]) and adds it.
  void add_tensor_f32(const std::string& name, GgmlType type, const std::vector<int64_t>& dims,
                      const float* data);
  // Writes atomically (temp file + rename); throws ModelError on I/O failure.
  void write(const std::string& path) const;

 private:
  struct Kv { std::string key; GgufValue value; };
  struct Tensor { std::string name; GgmlType type; std::vector<int64_t> dims; std::vector<uint8_t> data; };
  std::vector<Kv> kv_;
  std::vector<Tensor> tensors_;
  void put(const std::string& key, GgufValue v);
};

}  // namespace kvs
