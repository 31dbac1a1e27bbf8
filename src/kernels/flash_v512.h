// The AVX-512 vector traits of the tiled attention kernel
// (flash_rows_impl.h's V): 16 rows per vector, 16 keys per score pass.
// Include it only inside a KVS_TARGET_BEGIN region with at least
// "avx512f,avx2,fma", after <immintrin.h>, exp_poly.h and
// flash_attention.h, in an anonymous namespace of kvs::attn
// (flash_avx512.cpp, flash_amx_bf16.cpp). It includes nothing itself.
#pragma once

#define KVS_EXP_POLY_512
#include "kernels/exp_poly_simd.h"
#undef KVS_EXP_POLY_512

struct V512 {
  using reg = __m512;
  using mask = __mmask16;
  static constexpr int L = 16, KB = 16;
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static reg bcast(const float* p) { return _mm512_set1_ps(*p); }
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg fma_m(reg a, reg b, reg c, mask m) { return _mm512_mask3_fmadd_ps(a, b, c, m); }
  static reg select(mask m, reg a, reg b) { return _mm512_mask_blend_ps(m, b, a); }
  static mask mask_of(unsigned lanes) { return mask(lanes); }
  static mask gt(reg a, reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static reg gather(const float* base, const int* off) {
    return _mm512_i32gather_ps(_mm512_loadu_si512(off), base, 4);
  }
  // r [16] rows of 16 floats -> r [16] columns.
  static void transpose(reg* r) {
    reg t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    reg u[16];  // u[4i + k], 128-bit lane L: rows 4i..4i+3 of column 4L + k
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const reg x0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), x1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
      const reg x2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44), x3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
      r[k] = _mm512_shuffle_f32x4(x0, x2, 0x88);
      r[4 + k] = _mm512_shuffle_f32x4(x0, x2, 0xDD);
      r[8 + k] = _mm512_shuffle_f32x4(x1, x3, 0x88);
      r[12 + k] = _mm512_shuffle_f32x4(x1, x3, 0xDD);
    }
  }
  static void scatter(float* base, const int* off, unsigned lanes, reg x) {
    _mm512_mask_i32scatter_ps(base, mask(lanes), _mm512_loadu_si512(off), x, 4);
  }
  static reg exp(reg x) { return exp_poly512(x); }
  static bool all_equal(reg x, float c) { return _mm512_cmp_ps_mask(x, _mm512_set1_ps(c), _CMP_NEQ_UQ) == 0; }
  // exp2n_scalar of every lane: the same clamp, rounding, polynomial; scalef = ldexp.
  static reg exp2n(reg x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(kExp2Lo));
    const reg n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const reg f = _mm512_sub_ps(x, n);
    reg y = _mm512_set1_ps(kExp2C[0]);
    for (int i = 1; i < 7; ++i) y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(kExp2C[i]));
    return _mm512_scalef_ps(y, n);
  }
};

