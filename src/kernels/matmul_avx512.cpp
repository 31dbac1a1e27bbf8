// AVX-512 (F/BW/VL/DQ + VNNI) quantized-weight kernels.
//
// Compiled for AVX-512 with a `#pragma GCC target` placed after all includes,
// so only the functions defined in this file carry the ISA; nothing from a
// shared header (std templates, inline helpers) is emitted with AVX-512 code
// that the linker could pick for a baseline caller. Reached only through
// avx512_kernels() when active_isa() is Isa::Avx512, or Isa::Amx for what
// the tile kernels leave to it (amx_kernels(), matmul_amx.cpp).
//
// Layout: a "panel" is 16 weight rows, one per zmm lane. A 32-element weight
// block of the panel is unpacked to 8 vectors W[k] whose lane r holds the
// unsigned levels u = q + off of elements 4k..4k+3 of row r; then
//     isum[r] = corr + sum_k vpdpbusd(W[k], broadcast(x[4k..4k+3]))
// is the exact integer block dot of every row at once, and the float chain of
// matmul_internal.h runs per lane. n = 1 (decode) unpacks in registers; n > 1
// unpacks a panel slice once into scratch and reuses it for every activation
// row (8 rows per register tile).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/matmul_avx512_unpack.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

// GCC 12 reports its own _mm512_undefined_*() as uninitialised.
KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2,popcnt")

namespace {

using namespace avx512_detail;
constexpr int KB = 32;  // 32-element blocks per scratch panel slice
constexpr int R = 8;    // activation rows per GEMM register tile
// Scratch layout of one unpacked block: W[8] then ws0, ws1, wm (16 floats each).
constexpr size_t kPanelBlockBytes = 8 * 64 + 3 * 64;  // 704

// ---------------------------------------------------------------- activations

// Lane j = the maximum (Max) or the int32 sum of the 16 lanes of v[j]
// (both exact in any order), by a transposing tree; v is overwritten.
template <bool Max>
inline __m512 op16(__m512 a, __m512 b) {
  return Max ? _mm512_max_ps(a, b) : _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}
template <bool Max>
inline __m512 lanes_of_16(__m512* v) {
  for (int i = 0; i < 8; ++i)  // lanes 0..7: v[2i]'s halves combined, 8..15: v[2i + 1]'s
    v[i] = op16<Max>(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // quad k: four partials of the (4i + k)th input
    v[i] = op16<Max>(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
  const __m512 u0 = op16<Max>(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
  const __m512 u1 = op16<Max>(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
  const __m512 r = op16<Max>(_mm512_shuffle_ps(u0, u1, 0x44), _mm512_shuffle_ps(u0, u1, 0xEE));
  // r lane 4k + m holds input 4m + k.
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

// Sixteen blocks at once: the per-block maxima, scales and level sums come
// out of one transposing reduction each, not three horizontal ones per
// block. The same operations as the one-block loop below on each value.
void quantize_x16_avx512(const float* x, QFormat f, XBlock* out) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  __m512 a[16];
  for (int j = 0; j < 16; ++j)
    a[j] = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + 32 * j)),
                         _mm512_andnot_ps(sign, _mm512_loadu_ps(x + 32 * j + 16)));
  __m512 amax = lanes_of_16<true>(a);  // lane j: block j's maximum
  if (f.super) {  // K-quants: each super-block's maximum (lanes 0..7, 8..15)
    amax = _mm512_max_ps(amax, _mm512_permute_ps(amax, 0xB1));
    amax = _mm512_max_ps(amax, _mm512_permute_ps(amax, 0x4E));
    amax = _mm512_max_ps(amax, _mm512_shuffle_f32x4(amax, amax, 0xB1));
  }
  const __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
  const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ), _mm512_set1_ps(1.0f), d);
  alignas(64) float ids[16];
  _mm512_store_ps(ids, id);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  __m512 s0[16], s1[16];  // per block, the int32 levels of each half (as float bits)
  for (int j = 0; j < 16; ++j) {
    const __m512 vid = _mm512_set1_ps(ids[j]);
    const __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j), vid)), lo), hi);
    const __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j + 16), vid)), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[j].q), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[j].q + 16), _mm512_cvtepi32_epi8(q1));
    s0[j] = _mm512_castsi512_ps(q0);
    s1[j] = _mm512_castsi512_ps(q1);
  }
  const __m512i h0 = _mm512_castps_si512(lanes_of_16<false>(s0)), h1 = _mm512_castps_si512(lanes_of_16<false>(s1));
  const __m512i sum = _mm512_add_epi32(h0, h1);
  const __m512i off = _mm512_set1_epi32(-f.off);
  alignas(64) float ds[16], ss[16];
  alignas(64) int32_t c0[16], c1[16];
  _mm512_store_ps(ds, d);
  _mm512_store_ps(ss, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sum)));
  _mm512_store_si512(c0, _mm512_mullo_epi32(off, f.sub16 ? h0 : sum));
  _mm512_store_si512(c1, f.sub16 ? _mm512_mullo_epi32(off, h1) : f.super ? sum : _mm512_setzero_si512());
  for (int j = 0; j < 16; ++j) {
    out[j].d = ds[j];
    out[j].s = ss[j];
    out[j].corr[0] = c0[j];
    out[j].corr[1] = c1[j];
  }
}

void quantize_x_avx512(const float* x, int64_t cols, QFormat f, XBlock* out) {
  const int64_t nb = cols / kQBlock;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  int64_t b0 = 0;
  for (; b0 + 16 <= nb; b0 += 16) quantize_x16_avx512(x + 32 * b0, f, out + b0);
  float group = 0.0f;  // K-quants: the super-block's maximum
  for (int64_t b = b0; b < nb; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    if (f.super && b % kSuperBlocks == 0) {
      __m512 g = _mm512_setzero_ps();
      for (int64_t e = 32 * b; e < 32 * std::min(nb, b + kSuperBlocks); e += 16) g = _mm512_max_ps(g, _mm512_andnot_ps(sign, _mm512_loadu_ps(x + e)));
      group = _mm512_reduce_max_ps(g);
    }
    const __m512 a = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1));
    const float amax = f.super ? group : _mm512_reduce_max_ps(a);  // max is exact: order does not matter
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    // cvtps2dq rounds to nearest-even (default MXCSR), like round_rne().
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
    __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    q0 = _mm512_min_epi32(_mm512_max_epi32(q0, lo), hi);
    q1 = _mm512_min_epi32(_mm512_max_epi32(q1, lo), hi);
    XBlock& o = out[b];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o.q), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o.q + 16), _mm512_cvtepi32_epi8(q1));
    const int32_t s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
    o.d = d;
    o.s = d * float(s0 + s1);
    if (f.sub16) {
      o.corr[0] = -f.off * s0;
      o.corr[1] = -f.off * s1;
    } else {
      o.corr[0] = -f.off * (s0 + s1);
      o.corr[1] = f.super ? s0 + s1 : 0;
    }
  }
}

// Unit u of the panel rows into scratch (U::kBlocks blocks of 704 B).
template <class U>
inline void unpack_to_scratch(const Panel& p, int64_t u, uint8_t* dst) {
  U::unit(p, u, [&](int j, const __m512i* W, __m512 ws0, __m512 ws1, __m512 wm) {
    uint8_t* o = dst + j * kPanelBlockBytes;
    for (int k = 0; k < 8; ++k) _mm512_store_si512(o + 64 * k, W[k]);
    _mm512_store_ps(reinterpret_cast<float*>(o + 512), ws0);
    _mm512_store_ps(reinterpret_cast<float*>(o + 576), ws1);
    _mm512_store_ps(reinterpret_cast<float*>(o + 640), wm);
  });
}

// ------------------------------------------------------------ drivers

// n = 1: unpack in registers, one pass over the panel rows.
template <class U>
void matvec_fused(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, float* y) {
  const int64_t units = w.cols / kQBlock / U::kBlocks;
  Panel p;
  for (int64_t p0 = r0; p0 < r1; p0 += L) {
    make_panel(w, p0, r1, &p);
    __m512 acc = _mm512_setzero_ps();
    KSum S;  // K-quants: the super-block's integer sums (kblock)
    for (int64_t u = 0; u < units; ++u) {
      const XBlock* xb = xq + u * U::kBlocks;
      U::unit(p, u, [&](int j, const __m512i* W, __m512 ws0, __m512 ws1, __m512 wm) {
        acc = kblock<U::kSuper, U::kMin, U::kNib>(W, ws0, ws1, wm, xb[j], j, S, acc);
      });
    }
    _mm512_mask_storeu_ps(y + p0, p.valid, acc);
  }
}

// RT activation rows i0..i0+RT against a scratch slice of kb blocks starting
// at block kb0. Accumulators live in y between slices (exact round trip).
template <int RT, bool SUPER, bool MIN>
void tile_from_scratch(const uint8_t* slice, int64_t kb0, int64_t kb, const XBlock* xq, int64_t nb,
                       int64_t i0, float* y, int64_t ldy, int64_t p0, __mmask16 valid) {
  __m512 acc[RT];
  KSum S[RT];  // K-quants: super-block sums (kblock; slices hold whole super-blocks)
  for (int i = 0; i < RT; ++i)
    acc[i] = kb0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid, y + (i0 + i) * ldy + p0);
  for (int64_t bb = 0; bb < kb; ++bb) {
    const uint8_t* s = slice + bb * kPanelBlockBytes;
    __m512i W[8];
    for (int k = 0; k < 8; ++k) W[k] = _mm512_load_si512(s + 64 * k);
    const __m512 ws0 = _mm512_load_ps(reinterpret_cast<const float*>(s + 512));
    if constexpr (SUPER && MIN) {  // Q4_K / Q5_K: the mins' sum from the slice at the super-block's end
      const int j = int(bb % kSuperBlocks);
      for (int i = 0; i < RT; ++i) {
        const __m512i t = kmin_scaled(W, ws0, xq[(i0 + i) * nb + kb0 + bb]);
        S[i].s = j == 0 ? t : _mm512_add_epi32(S[i].s, t);
      }
      if (j != kSuperBlocks - 1) continue;
      __m512i mp[4];  // the mins as int16 pairs (m_2p, m_2p+1)
      kmin_pairs(s - j * kPanelBlockBytes, kPanelBlockBytes, mp);
      const __m512i dd = _mm512_load_si512(s + 640);
      for (int i = 0; i < RT; ++i) {
        const XBlock* xb = xq + (i0 + i) * nb + kb0 + bb - j;
        __m512i M = _mm512_setzero_si512();
        for (int p = 0; p < 4; ++p) M = _mm512_dpwssd_epi32(M, mp[p], xsum_pair(xb + 2 * p));
        acc[i] = kmin_finish(S[i].s, M, dd, xb[0].d, acc[i]);
      }
      continue;
    }
    const __m512 ws1 = SUPER ? _mm512_load_ps(reinterpret_cast<const float*>(s + 576)) : ws0;
    const __m512 wm = MIN || SUPER ? _mm512_load_ps(reinterpret_cast<const float*>(s + 640)) : ws0;
    for (int i = 0; i < RT; ++i)
      acc[i] = kblock<SUPER, MIN>(W, ws0, ws1, wm, xq[(i0 + i) * nb + kb0 + bb], int(bb % kSuperBlocks), S[i], acc[i]);
  }
  for (int i = 0; i < RT; ++i) _mm512_mask_storeu_ps(y + (i0 + i) * ldy + p0, valid, acc[i]);
}

// Two panels' accumulators for RT activation rows, at y's rows i0.. and
// columns p0.. (+0 at the first K slice); valid_b masks the second panel.
template <int RT>
inline __attribute__((always_inline)) void load_pair_acc(const float* y, int64_t ldy, int64_t i0, int64_t p0,
                                                         bool first, __mmask16 valid_b, __m512* aa, __m512* ab) {
  for (int i = 0; i < RT; ++i) {
    const float* yr = y + (i0 + i) * ldy + p0;
    aa[i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(yr);
    ab[i] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid_b, yr + L);
  }
}

// The exact dots of one block of two panels (levels wa, wb: 8 vectors
// each) with RT activation rows' blocks xr, added to ia / ib: each
// broadcast activation dword feeds both panels' vpdpbusd.
template <int RT>
inline __attribute__((always_inline)) void pair_dots(const uint8_t* wa, const uint8_t* wb, const XBlock* const* xr,
                                                     __m512i* ia, __m512i* ib) {
  for (int k = 0; k < 8; ++k) {
    const __m512i va = _mm512_load_si512(wa + 64 * k), vb = _mm512_load_si512(wb + 64 * k);
    for (int i = 0; i < RT; ++i) {
      const __m512i xv = bcast4(xr[i]->q + 4 * k);
      ia[i] = _mm512_dpbusd_epi32(ia[i], va, xv);
      ib[i] = _mm512_dpbusd_epi32(ib[i], vb, xv);
    }
  }
}

// Two panels (32 weight rows) x RT activation rows, one block at a time:
// each broadcast activation dword feeds two vpdpbusd, which halves the load
// traffic per integer op compared with one panel. Each pair runs one integer
// chain (RT >= 4 gives enough independent chains) and then exactly the float
// step of block_step(), so the results are bit-identical to it.
template <int RT, bool MIN>
void tile2_from_scratch(const uint8_t* sa, const uint8_t* sb, int64_t kb0, int64_t kb,
                        const XBlock* xq, int64_t nb, int64_t i0, float* y, int64_t ldy,
                        int64_t p0, __mmask16 valid_b) {
  __m512 aa[RT], ab[RT];
  load_pair_acc<RT>(y, ldy, i0, p0, kb0 == 0, valid_b, aa, ab);
  for (int64_t bb = 0; bb < kb; ++bb) {
    const uint8_t* wa = sa + bb * kPanelBlockBytes;
    const uint8_t* wb = sb + bb * kPanelBlockBytes;
    const XBlock* xr[RT];
    for (int i = 0; i < RT; ++i) xr[i] = xq + (i0 + i) * nb + kb0 + bb;
    __m512i ia[RT], ib[RT];
    for (int i = 0; i < RT; ++i) ia[i] = ib[i] = _mm512_set1_epi32(xr[i]->corr[0]);
    pair_dots<RT>(wa, wb, xr, ia, ib);
    const __m512 wsa = _mm512_load_ps(reinterpret_cast<const float*>(wa + 512));
    const __m512 wsb = _mm512_load_ps(reinterpret_cast<const float*>(wb + 512));
    for (int i = 0; i < RT; ++i) {
      const __m512 xd = _mm512_set1_ps(xr[i]->d);
      aa[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[i]), _mm512_mul_ps(wsa, xd), aa[i]);
      ab[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib[i]), _mm512_mul_ps(wsb, xd), ab[i]);
    }
    if (MIN) {
      const __m512 wma = _mm512_load_ps(reinterpret_cast<const float*>(wa + 640));
      const __m512 wmb = _mm512_load_ps(reinterpret_cast<const float*>(wb + 640));
      for (int i = 0; i < RT; ++i) {
        const __m512 xs = _mm512_set1_ps(xr[i]->s);
        aa[i] = _mm512_fmadd_ps(wma, xs, aa[i]);
        ab[i] = _mm512_fmadd_ps(wmb, xs, ab[i]);
      }
    }
  }
  for (int i = 0; i < RT; ++i) {
    float* yr = y + (i0 + i) * ldy + p0;
    _mm512_storeu_ps(yr, aa[i]);
    _mm512_mask_storeu_ps(yr + L, valid_b, ab[i]);
  }
}

// Q4_K / Q5_K, two panels x RT activation rows (tile2_from_scratch's
// sharing of each broadcast): per block the exact sums sc_j * isum_j go
// into the super-block sums S, and at its end the mins' sum M (from the
// slice) and kmin_finish: kblock's operations, the same bits.
template <int RT>
void tile2_kmin_from_scratch(const uint8_t* sa, const uint8_t* sb, int64_t kb0, int64_t kb, const XBlock* xq,
                             int64_t nb, int64_t i0, float* y, int64_t ldy, int64_t p0, __mmask16 valid_b) {
  __m512 aa[RT], ab[RT];
  load_pair_acc<RT>(y, ldy, i0, p0, kb0 == 0, valid_b, aa, ab);
  for (int64_t g = 0; g < kb; g += kSuperBlocks) {  // slices hold whole super-blocks
    __m512i Sa[RT], Sb[RT];
    for (int j = 0; j < kSuperBlocks; ++j) {
      const uint8_t* wa = sa + (g + j) * kPanelBlockBytes;
      const uint8_t* wb = sb + (g + j) * kPanelBlockBytes;
      const XBlock* xr[RT];
      for (int i = 0; i < RT; ++i) xr[i] = xq + (i0 + i) * nb + kb0 + g + j;
      const __m512i sca = _mm512_load_si512(wa + 512), scb = _mm512_load_si512(wb + 512);
      __m512i ia[RT], ib[RT];
      for (int i = 0; i < RT; ++i) ia[i] = ib[i] = _mm512_setzero_si512();  // level offset 0: no correction
      pair_dots<RT>(wa, wb, xr, ia, ib);
      for (int i = 0; i < RT; ++i) {
        const __m512i ta = _mm512_mullo_epi32(ia[i], sca), tb = _mm512_mullo_epi32(ib[i], scb);
        Sa[i] = j == 0 ? ta : _mm512_add_epi32(Sa[i], ta);
        Sb[i] = j == 0 ? tb : _mm512_add_epi32(Sb[i], tb);
      }
    }
    const uint8_t* wa = sa + g * kPanelBlockBytes;
    const uint8_t* wb = sb + g * kPanelBlockBytes;
    __m512i ma[4], mb[4];  // the mins as int16 pairs (m_2p, m_2p+1)
    kmin_pairs(wa, kPanelBlockBytes, ma);
    kmin_pairs(wb, kPanelBlockBytes, mb);
    const __m512i dda = _mm512_load_si512(wa + 640), ddb = _mm512_load_si512(wb + 640);
    for (int i = 0; i < RT; ++i) {
      const XBlock* xb = xq + (i0 + i) * nb + kb0 + g;
      __m512i Ma = _mm512_setzero_si512(), Mb = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {
        const __m512i xs = xsum_pair(xb + 2 * p);
        Ma = _mm512_dpwssd_epi32(Ma, ma[p], xs);
        Mb = _mm512_dpwssd_epi32(Mb, mb[p], xs);
      }
      aa[i] = kmin_finish(Sa[i], Ma, dda, xb[0].d, aa[i]);
      ab[i] = kmin_finish(Sb[i], Mb, ddb, xb[0].d, ab[i]);
    }
  }
  for (int i = 0; i < RT; ++i) {
    float* yr = y + (i0 + i) * ldy + p0;
    _mm512_storeu_ps(yr, aa[i]);
    _mm512_mask_storeu_ps(yr + L, valid_b, ab[i]);
  }
}

template <bool SUPER, bool MIN>
void tiles_from_scratch(const uint8_t* slice, int64_t kb0, int64_t kb, const XBlock* xq, int64_t nb,
                        int64_t n, float* y, int64_t ldy, int64_t p0, __mmask16 valid, int64_t i0) {
  for (; i0 + R <= n; i0 += R) tile_from_scratch<R, SUPER, MIN>(slice, kb0, kb, xq, nb, i0, y, ldy, p0, valid);
  for (; i0 + 4 <= n; i0 += 4) tile_from_scratch<4, SUPER, MIN>(slice, kb0, kb, xq, nb, i0, y, ldy, p0, valid);
  for (; i0 < n; ++i0) tile_from_scratch<1, SUPER, MIN>(slice, kb0, kb, xq, nb, i0, y, ldy, p0, valid);
}

template <bool SUPER, bool MIN>
void run_slice(const uint8_t* sa, const uint8_t* sb, int64_t kb0, int64_t kb, const XBlock* xq,
               int64_t nb, int64_t n, float* y, int64_t ldy, int64_t p0, __mmask16 valid_a,
               __mmask16 valid_b) {
  int64_t i0 = 0;
  if (SUPER && MIN && sb) {
    for (; i0 + 4 <= n; i0 += 4) tile2_kmin_from_scratch<4>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b);
    switch (n - i0) {
      case 3: tile2_kmin_from_scratch<3>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b); break;
      case 2: tile2_kmin_from_scratch<2>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b); break;
      case 1: tile2_kmin_from_scratch<1>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b); break;
      default: break;
    }
    return;
  }
  if (!SUPER && sb) {  // the K-quants' super-block sums per pair would not fit the registers
    for (; i0 + 6 <= n; i0 += 6) tile2_from_scratch<6, MIN>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b);
    switch (n - i0) {
      case 5: tile2_from_scratch<5, MIN>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b); break;
      case 4: tile2_from_scratch<4, MIN>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b); break;
      case 3: tile2_from_scratch<3, MIN>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b); break;
      case 2: tile2_from_scratch<2, MIN>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b); break;
      case 1: tile2_from_scratch<1, MIN>(sa, sb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b); break;
      default: break;
    }
    i0 = n;
  }
  tiles_from_scratch<SUPER, MIN>(sa, kb0, kb, xq, nb, n, y, ldy, p0, valid_a, i0);
  if (sb) tiles_from_scratch<SUPER, MIN>(sb, kb0, kb, xq, nb, n, y, ldy, p0 + L, valid_b, i0);
}

// General path: unpack a slice of KB blocks of two panels (32 rows) into
// scratch, then run every activation row against it.
template <class U>
void gemm_panels(const WeightView& w, QFormat f, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
                 float* y, int64_t ldy, Scratch scratch) {
  const int64_t nb = w.cols / kQBlock;
  uint8_t* slice_a = scratch.buf;  // [KB blocks][704 B], 64-B aligned
  uint8_t* slice_b = scratch.buf + KB * kPanelBlockBytes;
  Panel pa, pb;
  for (int64_t p0 = r0; p0 < r1; p0 += 2 * L) {
    make_panel(w, p0, r1, &pa);
    const bool two = p0 + L < r1;
    if (two) make_panel(w, p0 + L, r1, &pb);
    for (int64_t kb0 = 0; kb0 < nb; kb0 += KB) {
      const int64_t kb = nb - kb0 < KB ? nb - kb0 : KB;
      // KB and kb0 are multiples of 8, so K-quant units never straddle slices.
      for (int64_t bb = 0; bb < kb; bb += U::kBlocks) {
        unpack_to_scratch<U>(pa, (kb0 + bb) / U::kBlocks, slice_a + bb * kPanelBlockBytes);
        if (two) unpack_to_scratch<U>(pb, (kb0 + bb) / U::kBlocks, slice_b + bb * kPanelBlockBytes);
      }
      const uint8_t* sb = two ? slice_b : nullptr;
      const __mmask16 vb = two ? pb.valid : 0;
      if (f.super && f.has_min) run_slice<true, true>(slice_a, sb, kb0, kb, xq, nb, n, y, ldy, p0, pa.valid, vb);
      else if (f.super) run_slice<true, false>(slice_a, sb, kb0, kb, xq, nb, n, y, ldy, p0, pa.valid, vb);
      else if (f.has_min) run_slice<false, true>(slice_a, sb, kb0, kb, xq, nb, n, y, ldy, p0, pa.valid, vb);
      else run_slice<false, false>(slice_a, sb, kb0, kb, xq, nb, n, y, ldy, p0, pa.valid, vb);
    }
  }
}

// Panel16 weights at large n: copy each K slice of two packed panels into
// the scratch layout (a straight copy: no gather, no transpose) and run the
// scratch tiles. From n = kPackedScratchN on this beats reading the packed
// panels in place (bench_matmul Q8_0 n=512, one thread: 390-440 vs 345-410
// GFLOP/s): the slice is rewritten into the same hot scratch lines every
// time, where the packed slices are fresh lines each time.
constexpr int64_t kPackedScratchN = 64;

// Panel16 weights through scratch: `fill(panel, kb0, kb, dst)` writes blocks
// [kb0, kb0 + kb) of one packed panel in the scratch layout, then the
// scratch tiles run on two panels at a time, as gemm_panels does.
template <bool SUPER, bool MIN, class Fill>
void gemm_via_scratch(const WeightView& w, int64_t pbytes, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
                      float* y, int64_t ldy, Scratch scratch, Fill fill) {
  const int64_t nb = w.cols / kQBlock;
  uint8_t* slice_a = scratch.buf;  // [KB blocks][704 B], 64-B aligned
  uint8_t* slice_b = scratch.buf + KB * kPanelBlockBytes;
  for (int64_t p0 = r0; p0 < r1; p0 += 2 * L) {
    const uint8_t* pa = w.packed + (p0 / L) * pbytes;
    const bool two = p0 + L < r1;
    const __mmask16 va = lanes(r1 - p0), vb = two ? lanes(r1 - p0 - L) : 0;
    for (int64_t kb0 = 0; kb0 < nb; kb0 += KB) {
      const int64_t kb = nb - kb0 < KB ? nb - kb0 : KB;  // KB, kb0: multiples of 8 (whole K-quant super-blocks)
      fill(pa, kb0, kb, slice_a);
      if (two) fill(pa + pbytes, kb0, kb, slice_b);
      // The next slice of both panels streams from DRAM: request it now so
      // it arrives while this slice's tiles run, instead of stalling the
      // next fill (pp128 side by side, 7 runs: Q4_0 median 1.13x, Q8_0 1.02x).
      if (kb0 + KB < nb) {
        const int64_t from = (kb0 + KB) * pbytes / nb, to = std::min(nb, kb0 + 2 * KB) * pbytes / nb;
        for (int64_t o = from; o < to; o += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(pa + o), _MM_HINT_T1);
          if (two) _mm_prefetch(reinterpret_cast<const char*>(pa + pbytes + o), _MM_HINT_T1);
        }
      }
      run_slice<SUPER, MIN>(slice_a, two ? slice_b : nullptr, kb0, kb, xq, nb, n, y, ldy, p0, va, vb);
    }
  }
}

// Q8_0 / Q4_0 / MXFP4: a straight copy per block (levels, then the scale as float).
template <GgmlType T>
void gemm_packed_scratch(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n, float* y,
                         int64_t ldy, Scratch scratch) {
  using P = Pk<T>;
  const int64_t pbytes = P::panel_bytes(w.cols / kQBlock);
  gemm_via_scratch<false, false>(w, pbytes, r0, r1, xq, n, y, ldy, scratch,
                          [](const uint8_t* pan, int64_t kb0, int64_t kb, uint8_t* dst) {
                            for (int64_t bb = 0; bb < kb; ++bb) {
                              const uint8_t* l = P::lev(pan, kb0 + bb);
                              uint8_t* o = dst + bb * kPanelBlockBytes;
                              for (int k = 0; k < 8; ++k) _mm512_store_si512(o + 64 * k, P::vec(l, k));
                              // ws1 / wm stay unused: no sub16, no min
                              _mm512_store_ps(reinterpret_cast<float*>(o + 512), P::scale(pan, kb0 + bb));
                            }
                          });
}

// K-quants (U = PkK, PkQ5K, PkQ6K): each super-block's 8 blocks with their scales
// (ws0, ws1, wm as kblock takes them) as the scratch tiles read them.
template <class U>
void gemm_packed_scratch_k(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
                           float* y, int64_t ldy, Scratch scratch) {
  gemm_via_scratch<U::kSuper, U::kMin>(
      w, w.cols / 256 * U::UB, r0, r1, xq, n, y, ldy, scratch,
      [](const uint8_t* pan, int64_t kb0, int64_t kb, uint8_t* dst) {
        for (int64_t bb = 0; bb < kb; bb += 8)
          U::unit(pan + (kb0 + bb) / 8 * U::UB, [&](int j, const __m512i* W, __m512 ws0, __m512 ws1, __m512 wm) {
            uint8_t* o = dst + (bb + j) * kPanelBlockBytes;
            for (int k = 0; k < 8; ++k) _mm512_store_si512(o + 64 * k, W[k]);
            _mm512_store_ps(reinterpret_cast<float*>(o + 512), ws0);
            _mm512_store_ps(reinterpret_cast<float*>(o + 576), ws1);
            _mm512_store_ps(reinterpret_cast<float*>(o + 640), wm);
          });
      });
}

template <class U>
void run_fast(const WeightView& w, QFormat f, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
              float* y, int64_t ldy, Scratch s) {
  if (n == 1) matvec_fused<U>(w, r0, r1, xq, y);
  else gemm_panels<U>(w, f, r0, r1, xq, n, y, ldy, s);
}

void quant_rows_avx512(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
                       float* y, int64_t ldy, Scratch s) {
  if (w.pack == PackLayout::Panel16) {
    if (w.type == GgmlType::Q4_K && n > 1) return gemm_packed_scratch_k<PkK>(w, r0, r1, xq, n, y, ldy, s);
    if (w.type == GgmlType::Q5_K && n > 1) return gemm_packed_scratch_k<PkQ5K>(w, r0, r1, xq, n, y, ldy, s);
    if (w.type == GgmlType::Q6_K && n > 1) return gemm_packed_scratch_k<PkQ6K>(w, r0, r1, xq, n, y, ldy, s);
    if (n < kPackedScratchN) return quant_rows_avx512_packed(w, r0, r1, xq, n, y, ldy);
    if (w.type == GgmlType::Q4_0) return gemm_packed_scratch<GgmlType::Q4_0>(w, r0, r1, xq, n, y, ldy, s);
    if (w.type == GgmlType::MXFP4) return gemm_packed_scratch<GgmlType::MXFP4>(w, r0, r1, xq, n, y, ldy, s);
    return gemm_packed_scratch<GgmlType::Q8_0>(w, r0, r1, xq, n, y, ldy, s);
  }
  const QFormat f = qformat(w.type, false);
  switch (w.type) {  // the driver only sends is_quant_type() formats
    case GgmlType::Q4_0: return run_fast<UnpackQ4_0>(w, f, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q8_0: return run_fast<UnpackQ8_0>(w, f, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q4_1: return run_fast<UnpackQ4_1>(w, f, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q5_0: return run_fast<UnpackQ5<false>>(w, f, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q5_1: return run_fast<UnpackQ5<true>>(w, f, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q4_K: return run_fast<UnpackQK<false>>(w, f, r0, r1, xq, n, y, ldy, s);
    case GgmlType::Q5_K: return run_fast<UnpackQK<true>>(w, f, r0, r1, xq, n, y, ldy, s);
    case GgmlType::MXFP4: return run_fast<UnpackMXFP4>(w, f, r0, r1, xq, n, y, ldy, s);
    default: return run_fast<UnpackQ6K>(w, f, r0, r1, xq, n, y, ldy, s);
  }
}

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels k{2 * L, quantize_x_avx512, false, quant_rows_avx512,
                            float_rows_avx512};
  return k;
}

KVS_TARGET_END()

}  // namespace kvs::mm
