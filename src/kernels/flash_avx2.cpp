// AVX2 instance of the tiled attention kernel (flash_rows_impl.h): 8 rows
// per vector, 8 keys per score pass (16 registers). Compiled with
// -ffp-contract=off (CMakeLists.txt): the IEEE operations are the
// definition's, in its order.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/exp_poly.h"
#include "kernels/flash_attention.h"
#include "kernels/target_region.h"

namespace kvs::attn {

KVS_TARGET_BEGIN("avx2,fma")
namespace {

#define KVS_EXP_POLY_256
#include "kernels/exp_poly_simd.h"
#undef KVS_EXP_POLY_256

struct V256 {
  using reg = __m256;
  using mask = __m256;  // all-ones lanes
  static constexpr int L = 8, KB = 8;
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg x) { _mm256_storeu_ps(p, x); }
  static reg bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg fma_m(reg a, reg b, reg c, mask m) { return _mm256_blendv_ps(c, _mm256_fmadd_ps(a, b, c), m); }
  static reg select(mask m, reg a, reg b) { return _mm256_blendv_ps(b, a, m); }
  static mask mask_of(unsigned lanes) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(lanes)), bit), bit));
  }
  static reg gather(const float* base, const int* off) {
    return _mm256_i32gather_ps(base, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(off)), 4);
  }
  static void scatter(float* base, const int* off, unsigned lanes, reg x) {  // AVX2 has no scatter
    alignas(32) float t[8];
    _mm256_store_ps(t, x);
    for (int i = 0; i < 8; ++i)
      if (lanes >> i & 1u) base[off[i]] = t[i];
  }
  static reg exp(reg x) { return exp_poly256(x); }
  static bool all_equal(reg x, float c) { return _mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(c), _CMP_NEQ_UQ)) == 0; }
  // exp2n_scalar of every lane; 2^n built in the exponent field (n in [-100, 0]).
  static reg exp2n(reg x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(kExp2Lo));
    const reg n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const reg f = _mm256_sub_ps(x, n);
    reg y = _mm256_set1_ps(kExp2C[0]);
    for (int i = 1; i < 7; ++i) y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(kExp2C[i]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  }
};

#include "kernels/flash_rows_impl.h"

void begin_avx2(const FlashQuery& fq, float* st) { flash_rows::begin<V256>(fq, st); }
void tile_avx2(const FlashQuery& fq, float* st, const float* k, const float* v, const uint16_t* vis) {
  flash_rows::tile_any<V256>(fq, st, k, v, vis);
}
void finish_avx2(const FlashQuery& fq, const float* st, float* out, size_t ldo) {
  flash_rows::finish<V256>(fq, st, out, ldo);
}

}  // namespace
KVS_TARGET_END()

const FlashKernel& flash_kernel_avx2() {
  static const FlashKernel k{begin_avx2, tile_avx2, finish_avx2};
  return k;
}

}  // namespace kvs::attn
