// The K-quants Q6_K, Q4_K and Q5_K on the AMX-INT8 tiles, one 256-element
// super-block per float step, with the same bits as the VNNI kernels'
// kblock (matmul_internal.h).
//
// A super-block's dot is S = sum over its 16ths or 32nds i of sc_i * isum_i,
// an exact integer. The slice copy folds the sub-scales into the weights,
// v = sc * q (Q6_K |v| <= 4096, Q4_K 0 <= v <= 945, Q5_K 0 <= v <= 1953), and splits each v into
// two bytes, v = 256 * hi + lo with lo in [0, 255] and hi in [-16, 15]. Per
// K = 64 step c (two blocks) of super-block s, for 16 activation rows and
// the 16 weight rows of a panel:
//   A  [16, 64] s8  activation levels (XSuper: row stride 256)
//   Bl [16, 64] u8  lo bytes, in the Panel16 dword order (row k = elements
//                   4k .. 4k+3 of each weight row), blocks 2c then 2c + 1
//   Bh [16, 64] s8  hi bytes, the same order
//   Cl += tdpbsud(A, Bl), Ch += tdpbssd(A, Bh) over the four steps
// so S = 256 * Ch + Cl, exact (no sum leaves int32), and per row m
//   acc[m] = fma(float(S[m]), d * xd_m, acc[m])
// which is kblock's step. Q4_K / Q5_K add their mins' term once per super-block,
//   M[m] = sum_j m_j * xsum_j[m]          (four vpdpwssd on int16 pairs)
//   acc[m] = fma(float(M[m]), (-dmin) * xd_m, acc[m])
// The tile unit does the integer work of the chains per block that the
// K-quants needed before (docs/PERFORMANCE.md).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/matmul_amx_super_step.h"
#include "kernels/matmul_amx_tiles.h"
#include "kernels/matmul_avx512_unpack.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c,bmi,bmi2,popcnt,amx-tile,amx-int8")

namespace {

using namespace avx512_detail;
using namespace amx_detail;
using namespace super_step;

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

// Byte indices for vpermt2b: the lo bytes (even: the even products' low
// byte, odd: the odd products') and the hi bytes of 16-bit products pe, po.
struct SplitIdx {
  alignas(64) uint8_t lo[64], hi[64];
};
constexpr SplitIdx kSplit = [] {
  SplitIdx t{};
  for (int i = 0; i < 64; ++i) {
    t.lo[i] = uint8_t(i % 2 ? 64 + i - 1 : i);
    t.hi[i] = uint8_t(i % 2 ? 64 + i : i + 1);
  }
  return t;
}();

// Super-blocks [sb0, sb0 + nsb) of one Panel16 Q4_K (U = PkK) or Q5_K
// (PkQ5K) panel into the slice: v = sc_j * q (levels 0..15 or 0..31), d,
// -dmin, and the mins. Levels and scales fit maddubs (u8 x s8), which
// multiplies the even and odd bytes by the lane's sc_j; two byte permutes
// split the products.
template <class U>
void fill_q4k(const uint8_t* pan, int64_t sb0, int64_t nsb, uint8_t* dst) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i ilo = _mm512_load_si512(kSplit.lo), ihi = _mm512_load_si512(kSplit.hi);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m512i mins[4];
    U::unit(pan + (sb0 + sb) * U::UB, [&](int j, const __m512i* W, __m512 ws0, __m512 ws1, __m512 wm) {
      // ws0 / ws1: sc_j / m_j as int32 lanes; wm: d and dmin as each lane's fp16 pair.
      const __m512i sc = _mm512_castps_si512(ws0), sc16 = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
      uint8_t* lo = lo_of(dst, sb, j / 2) + (j % 2) * 512;  // rows 0..7: block 2c, 8..15: 2c + 1
      uint8_t* hi = hi_of(dst, sb, j / 2) + (j % 2) * 512;
      const __m512i sc_odd = _mm512_slli_epi32(sc16, 8);  // bytes (0, sc, 0, sc); sc16: (sc, 0, sc, 0)
      for (int k = 0; k < 8; ++k) {
        const __m512i pe = _mm512_maddubs_epi16(W[k], sc16), po = _mm512_maddubs_epi16(W[k], sc_odd);
        _mm512_store_si512(lo + 64 * k, _mm512_permutex2var_epi8(pe, ilo, po));
        _mm512_store_si512(hi + 64 * k, _mm512_permutex2var_epi8(pe, ihi, po));
      }
      const __m512i m = _mm512_and_si512(_mm512_castps_si512(ws1), low16);
      mins[j / 2] = j % 2 ? _mm512_or_si512(mins[j / 2], _mm512_slli_epi32(m, 16)) : m;
      if (j == 0) {
        const __m512i dd = _mm512_castps_si512(wm);
        _mm512_store_ps(d_of(dst, sb), half_lo(dd));
        _mm512_store_ps(nd_of(dst, sb), _mm512_xor_ps(half_hi(dd), _mm512_set1_ps(-0.0f)));
      }
    });
    for (int p = 0; p < 4; ++p) _mm512_store_si512(mins_of(dst, sb) + 16 * p, mins[p]);
  }
}

// An M tile's accumulators (`rows` of them, all 16 when FULL) from y, or
// zero at the first slice; and back. (Kept apart from matmul_amx.cpp's
// pair: the Q8_0 tiles measured slower sharing it.)
template <bool FULL>
inline void load_acc(const float* y, int64_t ldy, int rows, __mmask16 valid, bool zero, __m512* acc) {
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    acc[m] = zero ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid, y + m * ldy);
  }
}
template <bool FULL>
inline void store_acc(float* y, int64_t ldy, int rows, __mmask16 valid, const __m512* acc) {
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    _mm512_mask_storeu_ps(y + m * ldy, valid, acc[m]);
  }
}

// M tiles t < nt (x: the first one's XSuper of the slice's first
// super-block, the next ones xs XSupers apart; y at the first one's first
// row, the next ones 16 rows apart; rows of each) against the nsb
// super-blocks of the slice, which start at block kb0. The steps run as
// one sequence over the tiles, so the next tile's first products are in
// flight while this tile's last chain runs (a call per tile left the tile
// unit idle at each start), and each step's chain runs in four pieces
// between the next step's products. The accumulators live in y between
// slices.
template <bool MIN, bool FULL>
void super_rows(uint8_t* slice, int64_t kb0, int64_t nsb, const XSuper* x, int64_t xs, int64_t nt, int rows,
                float* y, int64_t ldy, __mmask16 valid, int32_t* cbuf, Ahead ahead) {
  __m512 acc[16];  // tile t's
  load_acc<FULL>(y, ldy, rows, valid, kb0 == 0, acc);
  int32_t* const ring[2] = {cbuf, cbuf + 512};  // step k's sums at ring[k % 2]
  const int64_t steps = nt * nsb;
  ahead.spread(steps);
  super_product(0, x, slice, 0, [](int) {});
  for (int64_t k = 0, t = 0, i = 0; k < steps; ++k) {  // step k: tile t, super-block i
    super_store(k, ring[k % 2]);
    const SuperConsts kc = super_consts<MIN>(slice, i);
    const int32_t* c = ring[k % 2];
    const XSuper& xk = x[t * xs + i];
    if (k + 1 < steps) {
      const int64_t t1 = i + 1 < nsb ? t : t + 1, i1 = i + 1 < nsb ? i + 1 : 0;
      super_product(k + 1, x + t1 * xs + i1, slice, i1, [&](int s) __attribute__((always_inline)) {
        super_chain<MIN, FULL>(c, kc, xk, rows, 4 * s, 4 * s + 4, acc);
      });
    } else {
      super_chain<MIN, FULL>(c, kc, xk, rows, 0, 16, acc);
    }
    ahead.at(k);
    if (++i == nsb) {
      store_acc<FULL>(y + 16 * t * ldy, ldy, rows, valid, acc);
      if (++t < nt) load_acc<FULL>(y + 16 * t * ldy, ldy, rows, valid, kb0 == 0, acc);
      i = 0;
    }
  }
}

}  // namespace

void tile_x_super(const XBlock* xq, int64_t n, int64_t nb, int64_t t0, int64_t t1, bool sums, XTile* out) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t s = 0; s < nb / kSuperBlocks; ++s) {
      XSuper& o = *reinterpret_cast<XSuper*>(out + t * nb + kSuperBlocks * s);
      for (int m = 0; m < 16; ++m) {
        const int64_t i = 16 * t + m;
        if (i >= n) {
          std::memset(o.q[m], 0, 256);
          o.d[m] = 0.0f;
          std::memset(o.xs[m], 0, sizeof o.xs[m]);
          continue;
        }
        const XBlock* xb = xq + i * nb + kSuperBlocks * s;
        for (int j = 0; j < kSuperBlocks; ++j) std::memcpy(o.q[m] + 32 * j, xb[j].q, 32);
        o.d[m] = xb[0].d;  // the same in all 8 (one scale per super-block)
        for (int j = 0; j < kSuperBlocks; ++j) o.xs[m][j] = sums ? int16_t(xb[j].corr[1]) : 0;
      }
    }
}

void panels_rows_super(const WeightView& w, int64_t r0, int64_t r1, const uint8_t* end, const XTile* xt, int64_t n,
                       float* y, int64_t ldy, Scratch scratch, int64_t sb0, int64_t sb1) {
  const bool q5k = w.type == GgmlType::Q5_K, q4k = w.type == GgmlType::Q4_K || q5k;  // q4k: with mins
  if (q4k && n <= kKQuantFewRows) return panels_rows_kquant_few(w, r0, r1, end, xt, n, y, ldy, scratch);
  const int64_t ub = super_unit_bytes(w.type);
  const int64_t nb = w.cols / kQBlock, nsb_all = nb / kSuperBlocks, pbytes = nsb_all * ub;
  const int64_t mt = (n + 15) / 16;
  // Super-blocks per K slice: two keep the slice in L1 beside the
  // activation tiles streaming past it (one and four measured slower).
  constexpr int64_t kSlice = 2;
  uint8_t* slice = scratch.buf;                                                       // [kSlice][kSuperBytes]
  int32_t* cbuf = reinterpret_cast<int32_t*>(scratch.buf + kSlice * kSuperBytes);  // [2][2][256] int32
  TileScope tiles(TileMode::Super);
  for (int64_t p0 = r0; p0 < r1; p0 += L) {
    const uint8_t* pan = w.packed + (p0 / L) * pbytes;
    const __mmask16 valid = lanes(r1 - p0);
    for (int64_t s0 = sb0; s0 < sb1; s0 += kSlice) {
      const int64_t nsb = std::min(kSlice, sb1 - s0);
      if (q5k) fill_q4k<PkQ5K>(pan, s0, nsb, slice);
      else if (q4k) fill_q4k<PkK>(pan, s0, nsb, slice);
      else fill_q6k(pan, s0, nsb, slice);
      // The next slice this call runs: this panel's next one, or the next panel's first.
      const uint8_t* from = s0 + nsb < sb1 ? pan + (s0 + nsb) * ub : pan + pbytes + sb0 * ub;
      const uint8_t* to = std::min(end, from + kSlice * ub);
      const Ahead next{from, std::max<int64_t>(0, (to - from) / 64)};
      // The whole M tiles in one sequence, a partial last one in another.
      const int64_t kb0 = s0 * kSuperBlocks, xs = nb / kSuperBlocks, seg[3] = {0, n / 16, mt};
      for (int g = 0; g < 2; ++g) {
        const int64_t t0 = seg[g], nt = seg[g + 1] - seg[g];
        if (nt == 0) continue;
        const XSuper* x = reinterpret_cast<const XSuper*>(xt + t0 * nb + kSuperBlocks * s0);
        const Ahead a = next.part(t0, t0 + nt, mt);
        const int rows = int(std::min<int64_t>(16, n - 16 * t0));
        float* yt = y + 16 * t0 * ldy + p0;
        if (q4k) {
          if (rows == 16) super_rows<true, true>(slice, kb0, nsb, x, xs, nt, rows, yt, ldy, valid, cbuf, a);
          else super_rows<true, false>(slice, kb0, nsb, x, xs, nt, rows, yt, ldy, valid, cbuf, a);
        } else {
          if (rows == 16) super_rows<false, true>(slice, kb0, nsb, x, xs, nt, rows, yt, ldy, valid, cbuf, a);
          else super_rows<false, false>(slice, kb0, nsb, x, xs, nt, rows, yt, ldy, valid, cbuf, a);
        }
      }
    }
  }
}

KVS_TARGET_END()

}  // namespace kvs::mm
