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

#include "kernels/flash_v512.h"
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
