// Q4_K and Q5_K on the AMX-INT8 tiles for few M tiles (n <= kKQuantFewRows:
// batched decode), with the same bits as kblock (matmul_internal.h).
//
// matmul_amx_super.cpp folds the sub-scales into the weights as it copies a
// slice, which pays when many M tiles share the copy; for one M tile the
// copy is most of the work. Here the slice holds the raw levels (0..15, or
// 0..31 for Q5_K: a plain copy), one K = 32 product per block gives the block sums
//   C [16, 16] s32 = tdpbssd(A [16, 32] activation levels, B [8, 64] levels)
// and the vector unit forms the super-block sum S = sum_j sc_j * isum_j
// (vpmulld, exact), then at the super-block's end kblock's float steps:
//   M[m] = sum_j m_j * xsum_j[m]                 (four vpdpwssd)
//   acc[m] = fma(float(S[m]), d * xd_m, acc[m])
//   acc[m] = fma(float(M[m]), (-dmin) * xd_m, acc[m])
// The accumulators live in y between super-blocks, the sums S in registers.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/matmul_amx_tiles.h"
#include "kernels/matmul_avx512_unpack.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2,popcnt,amx-tile,amx-int8")

namespace {

using namespace avx512_detail;
using namespace amx_detail;

// A slice in scratch, per super-block: the 8 blocks' levels [8][8, 64]
// (the Panel16 vector order), sc_j [8][16 int32], the mins as int16 pairs
// (m_2p, m_2p+1) [4][16 int32], d [16 floats], -dmin [16 floats].
constexpr int64_t kSuperBytes = 8 * 512 + 8 * 64 + 4 * 64 + 2 * 64;
inline uint8_t* lev_of(uint8_t* s, int64_t sb, int j) { return s + sb * kSuperBytes + 512 * j; }
inline int32_t* sc_of(uint8_t* s, int64_t sb, int j) {
  return reinterpret_cast<int32_t*>(s + sb * kSuperBytes + 8 * 512) + 16 * j;
}
inline int32_t* mins_of(uint8_t* s, int64_t sb) { return sc_of(s, sb, 8); }
inline float* d_of(uint8_t* s, int64_t sb) { return reinterpret_cast<float*>(mins_of(s, sb) + 64); }

// U: the unit reader, PkK (Q4_K) or PkQ5K (Q5_K).
template <class U>
void fill_raw(const uint8_t* pan, int64_t sb0, int64_t nsb, uint8_t* dst) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m512i mins[4];
    U::unit(pan + (sb0 + sb) * U::UB, [&](int j, const __m512i* W, __m512 ws0, __m512 ws1, __m512 wm) {
      uint8_t* l = lev_of(dst, sb, j);
      for (int k = 0; k < 8; ++k) _mm512_store_si512(l + 64 * k, W[k]);
      _mm512_store_si512(sc_of(dst, sb, j), _mm512_castps_si512(ws0));
      const __m512i m = _mm512_and_si512(_mm512_castps_si512(ws1), low16);
      mins[j / 2] = j % 2 ? _mm512_or_si512(mins[j / 2], _mm512_slli_epi32(m, 16)) : m;
      if (j == 0) {
        const __m512i dd = _mm512_castps_si512(wm);
        _mm512_store_ps(d_of(dst, sb), half_lo(dd));
        _mm512_store_ps(d_of(dst, sb) + 16, _mm512_xor_ps(half_hi(dd), _mm512_set1_ps(-0.0f)));
      }
    });
    for (int p = 0; p < 4; ++p) _mm512_store_si512(mins_of(dst, sb) + 16 * p, mins[p]);
  }
}

// Block i of the slice (super-block i / 8, block i % 8) on C tile i % 3
// from the A/B pair i % 2 (A 4 / B 6, A 5 / B 7); its store follows a
// block later (rot_product's reasoning, matmul_amx_tiles.h).
#define KVS_RAW(C, A, B)                         \
  KVS_TILE_LOAD(A, a, 256, 15 * 256 + 32);       \
  KVS_TILE_LOAD(B, b, 64, 512);                  \
  _tile_zero(C);                                 \
  _tile_dpbssd(C, A, B)
inline void raw_product(int64_t i, const XSuper* x, uint8_t* slice) {
  const int8_t* a = &x[i / 8].q[0][32 * (i % 8)];
  const uint8_t* b = lev_of(slice, i / 8, int(i % 8));
  switch (int(i % 6)) {
    case 0: KVS_RAW(0, 4, 6); break;
    case 1: KVS_RAW(1, 5, 7); break;
    case 2: KVS_RAW(2, 4, 6); break;
    case 3: KVS_RAW(0, 5, 7); break;
    case 4: KVS_RAW(1, 4, 6); break;
    default: KVS_RAW(2, 5, 7); break;
  }
}
#undef KVS_RAW

inline __m512i bcast_pair(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The super-block's float steps for rows m < rows, acc in y (+0 before the
// first super-block of the row).
inline void finish(const __m512i* S, uint8_t* slice, int64_t sb, const XSuper& x, int rows, bool first, float* y,
                   int64_t ldy, __mmask16 valid) {
  const __m512 vd = _mm512_load_ps(d_of(slice, sb)), vnd = _mm512_load_ps(d_of(slice, sb) + 16);
  __m512i mp[4];
  for (int p = 0; p < 4; ++p) mp[p] = _mm512_load_si512(mins_of(slice, sb) + 16 * p);
  for (int m = 0; m < rows; ++m) {
    __m512 acc = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid, y + m * ldy);
    __m512i mm = _mm512_madd_epi16(mp[0], bcast_pair(x.xs[m]));
    for (int p = 1; p < 4; ++p) mm = _mm512_dpwssd_epi32(mm, mp[p], bcast_pair(x.xs[m] + 2 * p));
    const __m512 xd = _mm512_set1_ps(x.d[m]);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[m]), _mm512_mul_ps(vd, xd), acc);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mm), _mm512_mul_ps(vnd, xd), acc);
    _mm512_mask_storeu_ps(y + m * ldy, valid, acc);
  }
}

// The M tile (x: the slice's first super-block; y at its first row)
// against the slice's nsb super-blocks, which start at super-block sb0.
void raw_rows(uint8_t* slice, int64_t sb0, int64_t nsb, const XSuper* x, int rows, float* y, int64_t ldy,
              __mmask16 valid, int32_t* cbuf, Ahead ahead) {
  const int64_t nblk = 8 * nsb;
  int32_t* const ring[3] = {cbuf, cbuf + 256, cbuf + 512};  // block i's sums at ring[i % 3]
  __m512i S[16];
  raw_product(0, x, slice);
  if (nblk > 1) raw_product(1, x, slice);
  rot_store(0, ring[0]);
  for (int64_t i = 0; i < nblk; ++i) {
    if (i + 1 < nblk) rot_store(i + 1, ring[(i + 1) % 3]);
    if (i + 2 < nblk) raw_product(i + 2, x, slice);
    const int j = int(i % 8);
    const __m512i sc = _mm512_load_si512(sc_of(slice, i / 8, j));
    const int32_t* c = ring[i % 3];
#pragma GCC unroll 16
    for (int m = 0; m < 16; ++m) {
      if (m >= rows) break;
      const __m512i t = _mm512_mullo_epi32(_mm512_load_si512(c + 16 * m), sc);
      S[m] = j == 0 ? t : _mm512_add_epi32(S[m], t);
    }
    if (j == 7) finish(S, slice, i / 8, x[i / 8], rows, sb0 + i / 8 == 0, y, ldy, valid);
    ahead.at(i);
  }
}

template <class U>
void panels_rows_few(const WeightView& w, int64_t r0, int64_t r1, const uint8_t* end, const XTile* xt, int64_t n,
                     float* y, int64_t ldy, Scratch scratch) {
  const int64_t nb = w.cols / kQBlock, nsb_all = nb / kSuperBlocks, pbytes = nsb_all * U::UB;
  constexpr int64_t kSlice = 2;  // super-blocks per K slice (as matmul_amx_super.cpp's, for L1)
  uint8_t* slice = scratch.buf;                                                       // [kSlice][kSuperBytes]
  int32_t* cbuf = reinterpret_cast<int32_t*>(scratch.buf + kSlice * kSuperBytes);  // [3][256] int32
  const int64_t mt = (n + 15) / 16;
  TileScope tiles(TileMode::K32);
  for (int64_t p0 = r0; p0 < r1; p0 += L) {
    const uint8_t* pan = w.packed + (p0 / L) * pbytes;
    const __mmask16 valid = lanes(r1 - p0);
    for (int64_t s0 = 0; s0 < nsb_all; s0 += kSlice) {
      const int64_t nsb = std::min(kSlice, nsb_all - s0);
      fill_raw<U>(pan, s0, nsb, slice);
      const uint8_t* from = pan + (s0 + nsb) * U::UB;
      const uint8_t* to = std::min(end, from + kSlice * U::UB);
      const Ahead next{from, std::max<int64_t>(0, (to - from) / 64)};
      for (int64_t t = 0; t < mt; ++t) {  // the M tiles share the slice and the next slice's request
        const XSuper* x = reinterpret_cast<const XSuper*>(xt + t * nb) + s0;
        raw_rows(slice, s0, nsb, x, int(std::min<int64_t>(16, n - 16 * t)), y + 16 * t * ldy + p0, ldy, valid, cbuf,
                 next.share(t, mt, 8 * nsb));
      }
    }
  }
}

}  // namespace

void panels_rows_kquant_few(const WeightView& w, int64_t r0, int64_t r1, const uint8_t* end, const XTile* xt,
                            int64_t n, float* y, int64_t ldy, Scratch scratch) {
  if (w.type == GgmlType::Q5_K) return panels_rows_few<PkQ5K>(w, r0, r1, end, xt, n, y, ldy, scratch);
  panels_rows_few<PkK>(w, r0, r1, end, xt, n, y, ldy, scratch);
}

KVS_TARGET_END()

}  // namespace kvs::mm
