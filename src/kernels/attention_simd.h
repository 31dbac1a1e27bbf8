// The two inner loops of attention — a dot product and y += a·x over one
// head's head_dim floats — per ISA. Each path fixes its own summation order,
// so results depend on the ISA only, never on batch or chunking.
#pragma once

namespace kvs::attn {

struct VecOps {
  float (*dot)(const float* a, const float* b, int n);
  void (*axpy)(float a, const float* x, float* y, int n);  // y += a * x
};

const VecOps& vec_ops_scalar();
const VecOps& vec_ops_avx2();    // needs AVX2 + FMA
const VecOps& vec_ops_avx512();  // needs AVX-512F
const VecOps& vec_ops();         // for active_isa()

}  // namespace kvs::attn
