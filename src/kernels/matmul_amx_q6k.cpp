// Q6_K on the AMX-INT8 tiles, one 256-element super-block per float step,
// with the same bits as the VNNI kernels' kblock (matmul_internal.h).
//
// A super-block's dot is S = sum over its halves h of sc_h * isum_h, an
// exact integer. The slice copy folds the int8 sub-scales into the weights,
// v = sc * q (|v| <= 4096), and splits each v into two bytes, v = 256 * hi +
// lo with lo in [0, 255] and hi in [-16, 15]. Per K = 64 step c (two blocks)
// of super-block s, for 16 activation rows and the 16 weight rows of a panel:
//   A  [16, 64] s8  activation levels (XSuper: row stride 256)
//   Bl [16, 64] u8  lo bytes, in the Panel16 dword order (row k = elements
//                   4k .. 4k+3 of each weight row), blocks 2c then 2c + 1
//   Bh [16, 64] s8  hi bytes, the same order
//   Cl += tdpbsud(A, Bl), Ch += tdpbssd(A, Bh) over the four steps
// so S = 256 * Ch + Cl, exact (no sum leaves int32), and per row m
//   acc[m] = fma(float(S[m]), d * xd_m, acc[m])
// which is kblock's step. The tile unit does the integer work of the two
// chains per block that Q6_K needed before (docs/PERFORMANCE.md).
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

// A slice in scratch, per super-block: the lo bytes [4][16, 64], the hi
// bytes [4][16, 64], then the panel's d [16 floats].
constexpr int64_t kStepBytes = 1024;
constexpr int64_t kSuperBytes = 8 * kStepBytes + 64;
inline uint8_t* lo_of(uint8_t* s, int64_t sb, int c) { return s + sb * kSuperBytes + c * kStepBytes; }
inline uint8_t* hi_of(uint8_t* s, int64_t sb, int c) { return s + sb * kSuperBytes + (4 + c) * kStepBytes; }
inline float* d_of(uint8_t* s, int64_t sb) { return reinterpret_cast<float*>(s + sb * kSuperBytes + 8 * kStepBytes); }

// One weight vector's v = sc * q as its lo and hi bytes, in place: q the
// signed levels (64 bytes, dword r = weight row r), sc16 the row's scale in
// both 16-bit halves of dword r. Even and odd bytes multiply in 16-bit
// lanes (|v| fits int16), and byte blends put each product's two bytes
// back where its level was; no lane crossing.
inline void split_products(__m512i q, __m512i sc16, __m512i* lo, __m512i* hi) {
  constexpr __mmask64 kOdd = 0xAAAAAAAAAAAAAAAAull;
  const __m512i pe = _mm512_mullo_epi16(_mm512_srai_epi16(_mm512_slli_epi16(q, 8), 8), sc16);  // even bytes' v
  const __m512i po = _mm512_mullo_epi16(_mm512_srai_epi16(q, 8), sc16);                        // odd bytes' v
  *lo = _mm512_mask_blend_epi8(kOdd, pe, _mm512_slli_epi16(po, 8));
  *hi = _mm512_mask_blend_epi8(kOdd, _mm512_srli_epi16(pe, 8), po);
}

// Super-blocks [sb0, sb0 + nsb) of one Panel16 Q6_K panel into the slice.
void fill_q6k(const uint8_t* pan, int64_t sb0, int64_t nsb, uint8_t* dst) {
  const __m512i off = _mm512_set1_epi8(32), low16 = _mm512_set1_epi32(0xFFFF);
  for (int64_t sb = 0; sb < nsb; ++sb)
    PkQ6K::unit(pan + (sb0 + sb) * PkQ6K::UB, [&](int j, const __m512i* W, __m512 ws0, __m512 ws1, __m512 d) {
      // ws0 / ws1: the halves' int8 scales as int32 lanes (PkQ6K); d: the panel's d.
      const __m512i sc[2] = {_mm512_castps_si512(ws0), _mm512_castps_si512(ws1)};
      uint8_t* lo = lo_of(dst, sb, j / 2) + (j % 2) * 512;  // rows 0..7: block 2c, 8..15: 2c + 1
      uint8_t* hi = hi_of(dst, sb, j / 2) + (j % 2) * 512;
      for (int h = 0; h < 2; ++h) {
        const __m512i sc16 = _mm512_or_si512(_mm512_and_si512(sc[h], low16), _mm512_slli_epi32(sc[h], 16));
        for (int k = 4 * h; k < 4 * h + 4; ++k) {
          __m512i l, u;
          split_products(_mm512_sub_epi8(W[k], off), sc16, &l, &u);
          _mm512_store_si512(lo + 64 * k, l);
          _mm512_store_si512(hi + 64 * k, u);
        }
      }
      if (j == 0) _mm512_store_ps(d_of(dst, sb), d);
    });
}

// Super-block i's products on C set i % 3 (tiles 0/1, 2/3, 4/5; A in
// tile 6, B in 7), stored one super-block later, once done: a tile store
// holds every later load behind it, for its product's latency too when it
// waits for one (rot_product in matmul_amx_tiles.h).
#define KVS_SUPER(CL, CH)                                     \
  _tile_zero(CL);                                             \
  _tile_zero(CH);                                             \
  for (int c = 0; c < 4; ++c) {                               \
    KVS_TILE_LOAD(6, &x->q[0][64 * c], 256, 3904);            \
    KVS_TILE_LOAD(7, lo_of(slice, sb, c), 64, 1024);          \
    _tile_dpbsud(CL, 6, 7);                                   \
    KVS_TILE_LOAD(7, hi_of(slice, sb, c), 64, 1024);          \
    _tile_dpbssd(CH, 6, 7);                                   \
  }
inline void super_product(int64_t i, const XSuper* x, uint8_t* slice, int64_t sb) {
  switch (int(i % 3)) {
    case 0: KVS_SUPER(0, 1); break;
    case 1: KVS_SUPER(2, 3); break;
    default: KVS_SUPER(4, 5); break;
  }
}
#undef KVS_SUPER
inline void super_store(int64_t i, int32_t* out) {  // lo sums at out, hi at out + 256
  switch (int(i % 3)) {
    case 0: KVS_TILE_STORE(0, out); KVS_TILE_STORE(1, out + 256); break;
    case 1: KVS_TILE_STORE(2, out); KVS_TILE_STORE(3, out + 256); break;
    default: KVS_TILE_STORE(4, out); KVS_TILE_STORE(5, out + 256); break;
  }
}

// kblock's float step for rows m < rows (all 16 when FULL): c holds the
// lo sums [16, 16], c + 256 the hi ones.
template <bool FULL>
inline __attribute__((always_inline)) void super_chain(const int32_t* c, const float* d, const XSuper& x, int rows,
                                                       __m512* acc) {
  const __m512 vd = _mm512_load_ps(d);
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    const __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c + 256 + 16 * m), 8),
                                       _mm512_load_si512(c + 16 * m));
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(vd, _mm512_set1_ps(x.d[m])), acc[m]);
  }
}

// One M tile (x: its XSuper of the slice's first super-block; y at its
// first row) against the nsb super-blocks of the slice, which start at
// block kb0. The accumulators live in y between slices.
template <bool FULL>
void super_rows(uint8_t* slice, int64_t kb0, int64_t nsb, const XSuper* x, int rows, float* y, int64_t ldy,
                __mmask16 valid, int32_t* cbuf, Ahead ahead) {
  __m512 acc[16];  // (matmul_amx.cpp's load_acc: kept apart, as the Q8_0 tiles measured slower sharing it)
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    acc[m] = kb0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid, y + m * ldy);
  }
  int32_t* const ring[3] = {cbuf, cbuf + 512, cbuf + 1024};  // super-block i's sums at ring[i % 3]
  super_product(0, x, slice, 0);
  if (nsb > 1) super_product(1, x + 1, slice, 1);
  super_store(0, ring[0]);
  for (int64_t i = 0; i < nsb; ++i) {  // no inner loop: the accumulators stay in registers
    if (i + 1 < nsb) super_store(i + 1, ring[(i + 1) % 3]);
    if (i + 2 < nsb) super_product(i + 2, x + i + 2, slice, i + 2);
    super_chain<FULL>(ring[i % 3], d_of(slice, i), x[i], rows, acc);
    ahead.at(i);
  }
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    _mm512_mask_storeu_ps(y + m * ldy, valid, acc[m]);
  }
}

}  // namespace

void tile_x_q6k(const XBlock* xq, int64_t n, int64_t nb, int64_t t0, int64_t t1, XTile* out) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t s = 0; s < nb / kSuperBlocks; ++s) {
      XSuper& o = *reinterpret_cast<XSuper*>(out + t * nb + kSuperBlocks * s);
      for (int m = 0; m < 16; ++m) {
        const int64_t i = 16 * t + m;
        if (i >= n) {
          std::memset(o.q[m], 0, 256);
          o.d[m] = 0.0f;
          continue;
        }
        const XBlock* xb = xq + i * nb + kSuperBlocks * s;
        for (int j = 0; j < kSuperBlocks; ++j) std::memcpy(o.q[m] + 32 * j, xb[j].q, 32);
        o.d[m] = xb[0].d;  // the same in all 8 (one scale per super-block)
      }
    }
}

void panels_rows_q6k(const WeightView& w, int64_t r0, int64_t r1, const uint8_t* end, const XTile* xt, int64_t n,
                     float* y, int64_t ldy, Scratch scratch) {
  const int64_t nb = w.cols / kQBlock, nsb_all = nb / kSuperBlocks, pbytes = nsb_all * PkQ6K::UB;
  constexpr int64_t kSlice = 4;  // super-blocks per K slice
  uint8_t* slice = scratch.buf;                                                       // [kSlice][kSuperBytes]
  int32_t* cbuf = reinterpret_cast<int32_t*>(scratch.buf + kSlice * kSuperBytes);  // [3][2][256] int32
  const int64_t mt = (n + 15) / 16;
  TileScope tiles(TileMode::Super);
  for (int64_t p0 = r0; p0 < r1; p0 += L) {
    const uint8_t* pan = w.packed + (p0 / L) * pbytes;
    const __mmask16 valid = lanes(r1 - p0);
    for (int64_t s0 = 0; s0 < nsb_all; s0 += kSlice) {
      const int64_t nsb = std::min(kSlice, nsb_all - s0);
      fill_q6k(pan, s0, nsb, slice);
      const uint8_t* from = pan + (s0 + nsb) * PkQ6K::UB;
      const uint8_t* to = std::min(end, from + kSlice * PkQ6K::UB);
      const Ahead next{from, std::max<int64_t>(0, (to - from) / 64)};
      for (int64_t t = 0; t < mt; ++t) {
        const XSuper* x = reinterpret_cast<const XSuper*>(xt + t * nb + kSuperBlocks * s0);
        const int64_t l0 = t * next.lines / mt, l1 = (t + 1) * next.lines / mt;
        Ahead a{next.p + 64 * l0, l1 - l0};
        a.spread(nsb);
        const int rows = int(std::min<int64_t>(16, n - 16 * t));
        float* yt = y + 16 * t * ldy + p0;
        if (rows == 16) super_rows<true>(slice, s0 * kSuperBlocks, nsb, x, rows, yt, ldy, valid, cbuf, a);
        else super_rows<false>(slice, s0 * kSuperBlocks, nsb, x, rows, yt, ldy, valid, cbuf, a);
      }
    }
  }
}

KVS_TARGET_END()

}  // namespace kvs::mm
