// AVX-512 instance of the tiled attention kernel (flash_rows_impl.h): 16
// rows per vector, 16 keys per score pass. Compiled with -ffp-contract=off
// (CMakeLists.txt): the IEEE operations are the definition's, in its order.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/exp_poly.h"
#include "kernels/flash_attention.h"
#include "kernels/target_region.h"

namespace kvs::attn {

KVS_TARGET_BEGIN("avx512f,avx2,fma")
namespace {

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
  static reg gather(const float* base, const int* off) {
    return _mm512_i32gather_ps(_mm512_loadu_si512(off), base, 4);
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

#include "kernels/flash_rows_impl.h"

void begin_avx512(const FlashQuery& fq, float* st) { flash_rows::begin<V512>(fq, st); }
void tile_avx512(const FlashQuery& fq, float* st, const float* k, const float* v, const uint16_t* vis) {
  flash_rows::tile_any<V512>(fq, st, k, v, vis);
}
void finish_avx512(const FlashQuery& fq, const float* st, float* out, size_t ldo) {
  flash_rows::finish<V512>(fq, st, out, ldo);
}

}  // namespace
KVS_TARGET_END()

const FlashKernel& flash_kernel_avx512() {
  static const FlashKernel k{begin_avx512, tile_avx512, finish_avx512};
  return k;
}

}  // namespace kvs::attn
