// Internal to src/model: the GGUF loader's tensor access (model_gguf.cpp,
// moe_gguf.cpp). Every tensor is checked (presence, shape, type) as it is
// loaded and remembered, so that the file's other tensors can be refused by
// name: a tensor kvserve would ignore is never silently skipped.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "model/model.h"

namespace kvs::detail {

// Loads tensors by name and remembers which, so that the file's other
// tensors can be refused by name.
class TensorLoader {
 public:
  explicit TensorLoader(Model& m) : m_(m), f_(*m.gguf_) {}

  // A weight matrix [rows, cols], stored with ggml dims {cols, rows}.
  WeightView matrix(const std::string& name, int64_t rows, int64_t cols) {
    const GgufTensorInfo& t = f_.tensor(name, {cols, rows});
    used_.insert(name);
    return view(t, rows, cols);
  }

  // Tensor t's data as a weight [rows, cols]; its type must be one kvserve computes.
  WeightView view(const GgufTensorInfo& t, int64_t rows, int64_t cols) const {
    const TypeTraits& tt = type_traits(t.type);
    if (!tt.supported)
      throw ModelError(f_.path() + ": tensor '" + t.name + "' has type " + tt.name +
                       ", which kvserve cannot compute (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                       "Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4)");
    WeightView w;
    w.type = t.type;
    w.data = t.data;
    w.rows = rows;
    w.cols = cols;
    w.row_stride = row_bytes(t.type, cols);
    return w;
  }

  // A 1-D float vector [n] (norm weights, biases, RoPE factors). Kept in
  // the mapping when it is F32 and 4-byte aligned; F16/BF16 (or a
  // misaligned F32) become owned f32.
  const float* vector(const std::string& name, int64_t n) { return floats(name, {n}); }
  // A float tensor of ggml dims `dims` (row length first), as vector().
  const float* floats(const std::string& name, const std::vector<int64_t>& dims) {
    const GgufTensorInfo& t = f_.tensor(name, dims);
    used_.insert(name);
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    if (t.type == GgmlType::F32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0)
      return reinterpret_cast<const float*>(t.data);
    if (t.type != GgmlType::F32 && t.type != GgmlType::F16 && t.type != GgmlType::BF16)
      throw ModelError(f_.path() + ": tensor '" + name + "' has type " + type_name(t.type) +
                       ", expected F32 (norm weights, biases and RoPE factors are stored unquantized)");
    auto& buf = m_.owned_f32_.emplace_back(static_cast<size_t>(n));
    dequantize_row(t.type, t.data, buf.data(), n);
    return buf.data();
  }
  const float* optional_vector(const std::string& name, int64_t n) {
    return f_.find_tensor(name) ? vector(name, n) : nullptr;
  }

  // A 3-D tensor [n, rows, cols] (ggml dims {cols, rows, n}: a MoE layer's
  // experts) as n matrices [rows, cols], each a contiguous slice.
  std::vector<WeightView> slices(const std::string& name, int64_t n, int64_t n_rows, int64_t cols) {
    const GgufTensorInfo& t = f_.tensor(name, {cols, n_rows, n});
    used_.insert(name);
    const WeightView all = view(t, n * n_rows, cols);
    std::vector<WeightView> v(size_t(n), all);
    for (int64_t e = 0; e < n; ++e) v[size_t(e)] = rows(all, e * n_rows, n_rows);
    return v;
  }

  // Rows [r0, r0 + n) of a matrix as a matrix of their own (fused tensors).
  static WeightView rows(const WeightView& w, int64_t r0, int64_t n) {
    WeightView v = w;
    v.data = w.row(r0);
    v.rows = n;
    return v;
  }

  // Every tensor of the file must have been loaded.
  void refuse_unused() const {
    for (const GgufTensorInfo& t : f_.tensors())
      if (!used_.count(t.name))
        throw ModelError(f_.path() + ": tensor '" + t.name + "' is in the file, but kvserve's " + m_.cfg_.arch +
                         " does not use it (an unsupported variant of the architecture?)");
  }

 private:
  Model& m_;
  const GgufFile& f_;
  std::set<std::string> used_;
};

}  // namespace kvs::detail
