// The two inner loops of attention — a dot product and y += a·x over one
// head's head_dim floats — per ISA. Each path fixes its own summation order,
// so results depend on the ISA only, never on batch or chunking.
#pragma once
#include <cstddef>

namespace kvs::attn {

struct VecOps {
  float (*dot)(const float* a, const float* b, int n);
  void (*axpy)(float a, const float* x, float* y, int n);  // y += a * x
  // Tile kernels of attention_group (one query token, the R heads of a kv
  // group, a run of n key rows). Each score is one dot product in the same
  // order as `dot`, and each output element sums over the rows in order,
  // so a row's result never depends on R, n or its neighbours.
  //   s[j * lds + i] = scale * dot(q_j, k_i)       q [R, hd], k rows at stride ldk
  void (*scores)(const float* q, int R, const float* k, size_t ldk, int n, int hd, float scale, float* s,
                 size_t lds);
  //   out_j += sum_i p[j * ldp + i] * v_i           v rows at stride ldv, out [R, hd]
  void (*accum)(const float* p, size_t ldp, int R, const float* v, size_t ldv, int n, int hd, float* out);
  // x = softmax(x) over n values.
  void (*softmax)(float* x, int n);
};

const VecOps& vec_ops_scalar();
const VecOps& vec_ops_avx2();    // needs AVX2 + FMA
const VecOps& vec_ops_avx512();  // needs AVX-512F
const VecOps& vec_ops();         // for active_isa()

}  // namespace kvs::attn
