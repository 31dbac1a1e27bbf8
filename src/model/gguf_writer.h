// GGUF v3 writer: metadata of every value type, tensors of any supported
// type, aligned per general.alignment (default 32).
#pragma once
#include <cstdint>
#include <functional>
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
  // Streaming variant for big models: `row` fills one row (dims[0] floats)
  // of row index r (0..rows-1, called in order, once each) while write()
  // runs; rows are quantized to `type` straight into the file, so only one
  // row is ever held in memory.
  using RowFn = std::function<void(int64_t r, float* out)>;
  void add_tensor_rows(const std::string& name, GgmlType type, const std::vector<int64_t>& dims, RowFn row);
  // Called after each tensor is written (index, count, name) for progress output.
  void on_progress(std::function<void(size_t, size_t, const std::string&)> cb) { progress_ = std::move(cb); }
  // Writes atomically (temp file + rename); throws ModelError on I/O failure.
  void write(const std::string& path) const;

 private:
  struct Kv { std::string key; GgufValue value; };
  struct Tensor {
    std::string name; GgmlType type; std::vector<int64_t> dims; std::vector<uint8_t> data;
    RowFn row;  // set instead of `data` for streamed tensors
  };
  std::function<void(size_t, size_t, const std::string&)> progress_;
  void check_new_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& dims) const;
  std::vector<Kv> kv_;
  std::vector<Tensor> tensors_;
  void put(const std::string& key, GgufValue v);
};

}  // namespace kvs
