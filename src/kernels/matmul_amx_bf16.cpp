// AMX-BF16 tile kernels for float weights packed as PackLayout::AmxBf16
// (MatmulPrecision::Bf16, chosen at load; weight_pack.h has the layout).
//
// One tdpbf16ps multiplies 16 activation rows by 16 weight rows over 32
// columns and adds the products into a float32 C tile:
//   A [16, 32] bf16  activation rows 16t .. 16t+15, columns 32c .. 32c+31
//                    (bf16_x's rows, kp elements each)
//   B [16, 32] bf16  chunk c of a weight panel: word 16j + r = columns
//                    32c + 2j, 32c + 2j + 1 of weight row r
//   C [16, 16] f32   C[m][r] += sum over the 32 columns of A[m] * W[r]
// C stays in its tile for the whole of K, chunk by chunk in increasing
// order, so an output's arithmetic depends only on its activation row and
// weight row: the same bits whatever n, whichever rows share its tile, and
// however the weight rows are split between threads. Up to 2 x 2 C tiles
// share each A and B load.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/matmul_amx_tiles.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,amx-tile,amx-bf16")

namespace {
using amx_detail::TileMode;
using amx_detail::TileScope;

// Tile loads and stores. The asm names the memory it touches only loosely,
// so it clobbers memory: the loop keeps no values in registers across them.
#define KVS_BF_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(int64_t(stride)) : "memory")
#define KVS_BF_STORE(t, base, stride) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(int64_t(stride)) : "memory")

// C tile T (a literal in the asm) to memory, rows `stride` bytes apart.
template <int T>
inline __attribute__((always_inline)) void tile_store(void* p, int64_t stride) {
  if constexpr (T == 0) KVS_BF_STORE(0, p, stride);
  else if constexpr (T == 1) KVS_BF_STORE(1, p, stride);
  else if constexpr (T == 2) KVS_BF_STORE(2, p, stride);
  else KVS_BF_STORE(3, p, stride);
}

// C tile (mi, ni) of a 2 x 2 block: tile 2 mi + ni.
template <int MT, int NT>
inline __attribute__((always_inline)) void zero_c() {
  _tile_zero(0);
  if (NT == 2) _tile_zero(1);
  if (MT == 2) _tile_zero(2);
  if (MT == 2 && NT == 2) _tile_zero(3);
}

// MT M tiles x NT panels over all kc chunks: a, the first activation row
// (stride as bytes); b, the first panel's chunks (the second at b + pb).
template <int MT, int NT>
inline __attribute__((always_inline)) void products(const uint16_t* a, int64_t astride, const uint8_t* b,
                                                    int64_t pb, int64_t kc) {
  zero_c<MT, NT>();
  for (int64_t c = 0; c < kc; ++c) {
    const uint16_t* ac = a + 32 * c;  // [16, 32] bf16 of M tile 0 ([16, 32] of tile 1 16 rows on)
    const uint8_t* bc = b + 1024 * c;
    KVS_BF_LOAD(4, ac, astride);
    KVS_BF_LOAD(6, bc, 64);
    if (NT == 2) KVS_BF_LOAD(7, bc + pb, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (NT == 2) _tile_dpbf16ps(1, 4, 7);
    if (MT == 2) {
      KVS_BF_LOAD(5, reinterpret_cast<const uint8_t*>(ac) + 16 * astride, astride);
      _tile_dpbf16ps(2, 5, 6);
      if (NT == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
}

// C tile `t` to y ([rows, cols] of it real, of [tile_rows, 16]): straight
// to y when whole, else through buf.
template <int T>
inline __attribute__((always_inline)) void store_c(float* y, int64_t ldy, int64_t rows, int64_t cols, int64_t tile_rows,
                                                   float* buf) {
  if (rows == tile_rows && cols == 16) {
    tile_store<T>(y, ldy * 4);
    return;
  }
  tile_store<T>(buf, 64);
  for (int64_t m = 0; m < rows; ++m) std::memcpy(y + m * ldy, buf + 16 * m, size_t(cols) * 4);
}

// rows, cols: real activation rows and weight rows of the whole block; tr,
// the rows of its C tiles.
template <int MT, int NT>
void block(const uint16_t* a, int64_t kp, const uint8_t* b, int64_t pb, int64_t rows, int64_t cols, int64_t tr,
           float* y, int64_t ldy, float* buf) {
  products<MT, NT>(a, kp * 2, b, pb, kp / 32);
  const int64_t r0 = std::min<int64_t>(rows, 16), c0 = std::min<int64_t>(cols, 16);
  store_c<0>(y, ldy, r0, c0, tr, buf);
  if (NT == 2) store_c<1>(y + 16, ldy, r0, cols - 16, tr, buf);
  if (MT == 2) store_c<2>(y + 16 * ldy, ldy, rows - 16, c0, tr, buf);
  if (MT == 2 && NT == 2) store_c<3>(y + 16 * ldy + 16, ldy, rows - 16, cols - 16, tr, buf);
}

}  // namespace

void row_to_bf16_avx512(GgmlType t, const uint8_t* row, int64_t cols, int64_t kp, uint16_t* out) {
  for (int64_t k = 0; k < kp; k += 16) {
    const int64_t left = std::max<int64_t>(0, std::min<int64_t>(16, cols - k));
    const __mmask16 m = __mmask16((1u << left) - 1);
    if (t == GgmlType::BF16) {
      const __m256i v = _mm256_maskz_loadu_epi16(m, row + 2 * k);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), v);
      continue;
    }
    const __m512 v = t == GgmlType::F32 ? _mm512_maskz_loadu_ps(m, row + 4 * k)
                                        : _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
}

void bf16_x_amx(const float* x, int64_t ldx, int64_t cols, int64_t i0, int64_t i1, int64_t kp, uint16_t* out) {
  for (int64_t i = i0; i < i1; ++i) {
    const float* xi = x + i * ldx;
    uint16_t* o = out + i * kp;
    for (int64_t k = 0; k < kp; k += 16) {
      const int64_t left = std::max<int64_t>(0, std::min<int64_t>(16, cols - k));
      const __mmask16 m = __mmask16((1u << left) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(m, xi + k);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + k), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    }
  }
}

void bf16_rows_amx(const WeightView& w, int64_t r0, int64_t r1, const uint16_t* xb, int64_t n, float* y,
                   int64_t ldy) {
  const int64_t kp = (w.cols + 31) / 32 * 32, pb = kp * 32;
  alignas(64) float buf[256];  // [16, 16]: a partial C tile on its way to y
  // Fewer than 16 rows (decode, small batches): tiles of n rows, so the
  // products and activation loads cover no padding.
  const int64_t tr = std::min<int64_t>(n, 16);
  TileScope tiles(TileMode::Bf16, int(tr));
  for (int64_t p0 = r0; p0 < r1; p0 += 32) {
    const uint8_t* b = w.packed + (p0 / 16) * pb;
    const int64_t cols = std::min<int64_t>(32, r1 - p0);
    for (int64_t i0 = 0; i0 < n; i0 += 32) {
      const int64_t rows = std::min<int64_t>(32, n - i0);
      const uint16_t* a = xb + i0 * kp;
      float* yb = y + i0 * ldy + p0;
      if (rows > 16 && cols > 16) block<2, 2>(a, kp, b, pb, rows, cols, tr, yb, ldy, buf);
      else if (rows > 16) block<2, 1>(a, kp, b, pb, rows, cols, tr, yb, ldy, buf);
      else if (cols > 16) block<1, 2>(a, kp, b, pb, rows, cols, tr, yb, ldy, buf);
      else block<1, 1>(a, kp, b, pb, rows, cols, tr, yb, ldy, buf);
    }
  }
}

#undef KVS_BF_LOAD
#undef KVS_BF_STORE

KVS_TARGET_END()

}  // namespace kvs::mm
