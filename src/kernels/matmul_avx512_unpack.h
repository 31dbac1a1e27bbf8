// AVX-512 weight unpackers for the AVX-512 and AMX kernel files
// (matmul_avx512*.cpp, matmul_amx.cpp; include it from those only).
//
// A panel is 16 weight rows, one per zmm lane. An unpacker turns one storage
// unit of the 16 rows (a 32-element block, or a 256-element K-quant
// super-block = 8 blocks) into, per 32-element block j:
//   W[8]  u8 levels, W[k] lane r = elements 4k..4k+3 of row r, u = q + off
//   ws0 (ws1 for Q6_K's second half), wm  floats per lane
//   (K-quants: integer scales as int32 lanes, kblock below)
// and hands them to a sink `f(j, W, ws0, ws1, wm)`. The values are exactly
// those of unpack_block() in matmul_scalar.cpp (tests compare bit-exactly).
//
// Row data is gathered with one 16-byte load per row: the first of every
// 4 rows plainly, the others as masked 128-bit broadcasts (pure load uops
// plus a p0/p5 merge, cheaper than vinserti32x4 on the shuffle port), then a
// 4x4 dword transpose inside each 128-bit lane.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2,popcnt")

namespace kvs::mm::avx512_detail {

constexpr int L = 16;  // rows per panel

// The 16 rows of a panel; lanes past the last real row repeat it (their
// results are never stored).
struct Panel {
  const uint8_t* rp[L];  // row pointers per lane
  const uint8_t* base;   // rp[0]
  __m512i gidx;          // rp[lane] - base as int32, for gathers
  __mmask16 valid;       // lanes holding real rows
};

// Lanes 0 .. n-1 (all 16 when n >= 16).
inline __mmask16 lanes(int64_t n) { return n >= L ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

inline void make_panel(const WeightView& w, int64_t p0, int64_t r1, Panel* p) {
  const int64_t nvalid = r1 - p0 < L ? r1 - p0 : L;
  alignas(64) int32_t off[L];
  for (int lane = 0; lane < L; ++lane) {
    const int64_t r = lane < nvalid ? lane : nvalid - 1;
    p->rp[lane] = w.row(p0 + r);
    off[lane] = int32_t(r * int64_t(w.row_stride));
  }
  p->base = p->rp[0];
  p->gidx = _mm512_load_si512(off);
  p->valid = __mmask16((1u << nvalid) - 1);
}

// 4x4 transpose of dwords inside each 128-bit lane.
inline void transpose4(__m512i a0, __m512i a1, __m512i a2, __m512i a3, __m512i* g) {
  const __m512i t0 = _mm512_unpacklo_epi32(a0, a1), t1 = _mm512_unpackhi_epi32(a0, a1);
  const __m512i t2 = _mm512_unpacklo_epi32(a2, a3), t3 = _mm512_unpackhi_epi32(a2, a3);
  g[0] = _mm512_unpacklo_epi64(t0, t2);
  g[1] = _mm512_unpackhi_epi64(t0, t2);
  g[2] = _mm512_unpacklo_epi64(t1, t3);
  g[3] = _mm512_unpackhi_epi64(t1, t3);
}

inline __m128i ld16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// 16 bytes at `off` of every row: g[k] lane r = dword k of row r.
// Vector j holds rows (j, j+4, j+8, j+12) in its 128-bit slots, so after the
// in-slot transpose lane 4s+j is row 4s+j.
inline void load_rows16(const Panel& p, int64_t off, __m512i* g) {
  __m512i a[4];
  for (int j = 0; j < 4; ++j) {
    __m512i v = _mm512_castsi128_si512(ld16(p.rp[j] + off));
    v = _mm512_mask_broadcast_i32x4(v, 0x00F0, ld16(p.rp[j + 4] + off));
    v = _mm512_mask_broadcast_i32x4(v, 0x0F00, ld16(p.rp[j + 8] + off));
    v = _mm512_mask_broadcast_i32x4(v, 0xF000, ld16(p.rp[j + 12] + off));
    a[j] = v;
  }
  transpose4(a[0], a[1], a[2], a[3], g);
}

inline __m512i gather32(const Panel& p, int64_t off) {
  return _mm512_i32gather_epi32(p.gidx, p.base + off, 1);
}
// fp16 in the low half of each gathered dword -> float.
inline __m512 half_lo(__m512i g) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)); }
inline __m512 half_hi(__m512i g) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))); }

inline void nibbles(const __m512i* g, __m512i* W) {  // g[0..3] -> W[0..7] (lo then hi nibbles)
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k) {
    W[k] = _mm512_and_si512(g[k], m4);
    W[k + 4] = _mm512_and_si512(_mm512_srli_epi16(g[k], 4), m4);
  }
}

// Adds 16 to byte i of every lane of w where bit (base + i) of the lane's
// 32-bit word q is set (the fifth bit of Q5_0 / Q5_1 levels).
inline __m512i add_bit4(__m512i w, __m512i q, int base) {
  const int byte = base / 8, sh = base % 8;
  const int32_t b = byte * 0x01010101;
  const __m512i ctrl = _mm512_set4_epi32(b + 0x0C0C0C0C, b + 0x08080808, b + 0x04040404, b);
  const __m512i rep = _mm512_shuffle_epi8(q, ctrl);
  const __mmask64 m = _mm512_test_epi8_mask(rep, _mm512_set1_epi32(0x08040201 << sh));
  return _mm512_mask_add_epi8(w, m, w, _mm512_set1_epi8(16));
}

struct UnpackQ4_0 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = false, kNib = false;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockQ4_0));
    __m512i g[4], W[8];
    load_rows16(p, o + 2, g);
    nibbles(g, W);
    const __m512 ws = half_lo(gather32(p, o));
    f(0, W, ws, ws, ws);
  }
};

struct UnpackQ4_1 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = true, kNib = false;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockQ4_1));
    __m512i g[4], W[8];
    load_rows16(p, o + 4, g);
    nibbles(g, W);
    const __m512i dm = gather32(p, o);
    const __m512 ws = half_lo(dm), wm = half_hi(dm);
    f(0, W, ws, ws, wm);
  }
};

template <bool ONE>  // Q5_1 (true) / Q5_0
struct UnpackQ5 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = ONE, kNib = false;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(ONE ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
    const int64_t qh_off = ONE ? 4 : 2;
    __m512i g[4], W[8];
    load_rows16(p, o + qh_off + 4, g);
    nibbles(g, W);
    const __m512i qh = gather32(p, o + qh_off);
    for (int k = 0; k < 4; ++k) {
      W[k] = add_bit4(W[k], qh, 4 * k);
      W[k + 4] = add_bit4(W[k + 4], qh, 16 + 4 * k);
    }
    const __m512i dm = gather32(p, o);
    const __m512 ws = half_lo(dm);
    f(0, W, ws, ws, ONE ? half_hi(dm) : ws);
  }
};

// Half the E8M0 scale per lane, 2^(e - 128), from e (0..255) in each
// dword: e8m0_half() of quant.h lane by lane, the subnormals of e < 2 included.
inline __m512 e8m0_half_ps(__m512i e) {
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
  const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
  const __mmask16 lt2 = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(lt2, normal, sub));
}

// kMxfp4Levels in every 128-bit lane: vpshufb turns codes into levels u.
inline __m512i mxfp4_table() {
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Levels.u)));
}

// MXFP4: the codes are nibbles laid out as Q4_0's, looked up to u = value + 12.
struct UnpackMXFP4 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = false, kNib = false;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockMXFP4));
    __m512i g[4], W[8];
    load_rows16(p, o + 1, g);
    nibbles(g, W);
    const __m512i tbl = mxfp4_table();
    for (int k = 0; k < 8; ++k) W[k] = _mm512_shuffle_epi8(tbl, W[k]);
    // The gathered dword starts at e; its other three bytes are codes.
    const __m512 ws = e8m0_half_ps(_mm512_and_si512(gather32(p, o), _mm512_set1_epi32(0xFF)));
    f(0, W, ws, ws, ws);
  }
};

struct UnpackQ8_0 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = false, kNib = false;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockQ8_0));
    __m512i g[4], W[8];
    const __m512i flip = _mm512_set1_epi8(char(0x80));  // u = q + 128
    load_rows16(p, o + 2, g);
    for (int k = 0; k < 4; ++k) W[k] = _mm512_xor_si512(g[k], flip);
    load_rows16(p, o + 18, g);
    for (int k = 0; k < 4; ++k) W[k + 4] = _mm512_xor_si512(g[k], flip);
    const __m512 ws = half_lo(gather32(p, o));
    f(0, W, ws, ws, ws);
  }
};

// Byte `i` (0..11) of the 12-byte K-quant scale field as an int32 lane value,
// from the three gathered dwords s[0..2].
inline __m512i kbyte(const __m512i* s, int i) {
  return _mm512_and_si512(_mm512_srli_epi32(s[i / 4], 8 * (i % 4)), _mm512_set1_epi32(0xFF));
}

// Per-lane 6-bit scales sc_j and mins m_j of the 8 blocks of a Q4_K / Q5_K
// super-block (ggml's get_scale_min_k4, vectorised), as int32 lanes, and
// the super-block's d and dmin as the fp16 pair of each lane's dword.
inline void k4_scales(const Panel& p, int64_t o, __m512i* ws, __m512i* wm, __m512i* dd) {
  *dd = gather32(p, o);
  __m512i s[3];
  for (int i = 0; i < 3; ++i) s[i] = gather32(p, o + 4 + 4 * i);
  const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15);
  for (int j = 0; j < 8; ++j) {
    __m512i sc, mn;
    if (j < 4) {
      sc = _mm512_and_si512(kbyte(s, j), m63);
      mn = _mm512_and_si512(kbyte(s, j + 4), m63);
    } else {
      const __m512i hi = kbyte(s, j + 4);
      sc = _mm512_or_si512(_mm512_and_si512(hi, m15), _mm512_slli_epi32(_mm512_srli_epi32(kbyte(s, j - 4), 6), 4));
      mn = _mm512_or_si512(_mm512_srli_epi32(hi, 4), _mm512_slli_epi32(_mm512_srli_epi32(kbyte(s, j), 6), 4));
    }
    ws[j] = sc;
    wm[j] = mn;
  }
}

template <bool FIVE>  // Q5_K (true) / Q4_K
struct UnpackQK {
  static constexpr int kBlocks = 8;
  static constexpr bool kSuper = true, kMin = true, kNib = !FIVE;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(FIVE ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
    __m512i ws[8], wm[8], dd;
    k4_scales(p, o, ws, wm, &dd);
    __m512i qh[8];
    if (FIVE) {
      load_rows16(p, o + 16, qh);
      load_rows16(p, o + 32, qh + 4);
    }
    const int64_t qs_off = o + 16 + (FIVE ? 32 : 0);
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    for (int c = 0; c < 4; ++c) {  // blocks 2c (low nibbles) and 2c+1 (high)
      __m512i g[8];
      load_rows16(p, qs_off + 32 * c, g);
      load_rows16(p, qs_off + 32 * c + 16, g + 4);
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h;
        __m512i W[8];
        for (int k = 0; k < 8; ++k) {
          W[k] = _mm512_and_si512(h ? _mm512_srli_epi16(g[k], 4) : g[k], m4);
          if (FIVE) {  // bit j of qh[l] -> bit 4 of the level byte
            const __m512i hb = j <= 4 ? _mm512_slli_epi32(qh[k], 4 - j) : _mm512_srli_epi32(qh[k], j - 4);
            W[k] = _mm512_or_si512(W[k], _mm512_and_si512(hb, b4));
          }
        }
        f(j, W, _mm512_castsi512_ps(ws[j]), _mm512_castsi512_ps(wm[j]), _mm512_castsi512_ps(dd));
      }
    }
  }
};

struct UnpackQ6K {
  static constexpr int kBlocks = 8;
  static constexpr bool kSuper = true, kMin = false, kNib = false;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockQ6_K));
    const __m512 d = half_lo(gather32(p, o + 208));
    __m512i sc[4];  // int8 scales, 4 per dword
    for (int i = 0; i < 4; ++i) sc[i] = gather32(p, o + 192 + 4 * i);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03);
    for (int chunk = 0; chunk < 2; ++chunk) {
      __m512i ql[16], qh[8];
      for (int i = 0; i < 4; ++i) load_rows16(p, o + 64 * chunk + 16 * i, ql + 4 * i);
      load_rows16(p, o + 128 + 32 * chunk, qh);
      load_rows16(p, o + 128 + 32 * chunk + 16, qh + 4);
      for (int uu = 0; uu < 4; ++uu) {
        const int t8 = 4 * chunk + uu;
        const __m512i* lq = ql + 8 * (uu & 1);
        __m512i W[8];
        for (int k = 0; k < 8; ++k) {
          const __m512i lo = _mm512_and_si512(uu >> 1 ? _mm512_srli_epi16(lq[k], 4) : lq[k], m4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(qh[k], 2 * uu), m3);
          W[k] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
        }
        __m512 s[2];  // the halves' int8 scales, as int32 lanes in float registers (kblock)
        for (int h = 0; h < 2; ++h) {
          const int i = 2 * t8 + h;  // scale index 0..15, sign-extended byte
          s[h] = _mm512_castsi512_ps(_mm512_srai_epi32(_mm512_slli_epi32(sc[i / 4], 24 - 8 * (i % 4)), 24));
        }
        f(t8, W, s[0], s[1], d);
      }
    }
  }
};

// ------------------------------------------------------------ Panel16 copies

// Addressing of one packed panel of a 32-element format T (Q8_0, Q4_0,
// MXFP4; layout in weight_pack.h): units of kPer blocks, each unit its
// blocks' levels then their scales.
template <GgmlType T>
struct Pk {
  static constexpr bool kMx = T == GgmlType::MXFP4;
  static constexpr bool kNibble = T != GgmlType::Q8_0;
  static constexpr int kShift = kMx ? 2 : 1;
  static constexpr int64_t kPer = int64_t(1) << kShift;  // blocks per unit
  static constexpr int64_t LB = kNibble ? 256 : 512;    // level bytes per block
  static constexpr int64_t SB = kMx ? 16 : 32;          // scale bytes per block
  static constexpr int64_t UB = kPer * (LB + SB);        // bytes per unit, a multiple of 64
  static_assert(UB % 64 == 0, "units start on whole vectors");
  static constexpr int kOff = T == GgmlType::Q8_0 ? 128 : T == GgmlType::Q4_0 ? 8 : 12;  // u = q + kOff
  static int64_t panel_bytes(int64_t nb) { return (nb + kPer - 1) / kPer * UB; }
  // b >= 0: shifts and masks, not signed division.
  static const uint8_t* lev(const uint8_t* pan, int64_t b) { return pan + (b >> kShift) * UB + (b & (kPer - 1)) * LB; }
  static __m512 scale(const uint8_t* pan, int64_t b) {
    const uint8_t* s = pan + (b >> kShift) * UB + kPer * LB + (b & (kPer - 1)) * SB;
    if constexpr (kMx) return e8m0_half_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(s))));
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(s)));
  }
  // Vector k (0..7) of u8 levels: lane r = elements 4k..4k+3 of row r.
  static __m512i vec(const uint8_t* l, int k) {
    if (!kNibble) return _mm512_load_si512(l + 64 * k);
    const __m512i g = _mm512_load_si512(l + 64 * (k & 3));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i c = k < 4 ? _mm512_and_si512(g, m4) : _mm512_and_si512(_mm512_srli_epi16(g, 4), m4);
    if constexpr (kMx) return _mm512_shuffle_epi8(mxfp4_table(), c);
    return c;
  }
};

// One Q4_K (FIVE: Q5_K) super-block of a packed panel (the units of
// weight_pack.h): hands the sink f(j, W, ws0, ws1, wm) each sub-block j's
// levels W[8], sc_j and m_j as int32 lanes and d / dmin as each lane's fp16
// pair, as UnpackQK forms them from the file. Q5_K's unit adds the qh
// vectors: bit j of a lane's qh bytes becomes bit 4 of block j's levels.
// Q5_K is not NIB: a half block's sum of 5-bit levels can reach 2^15.
template <bool FIVE>
struct PkKq {
  static constexpr int64_t UB = FIVE ? 2880 : 2368;
  static constexpr bool kSuper = true, kMin = true, kNib = !FIVE;
  template <class F>
  static inline void unit(const uint8_t* u, F&& f) {
    const __m512i dd = _mm512_or_si512(
        _mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 2048))),
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 2080))), 16));
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    __m512i qh[8];
    if constexpr (FIVE)
      for (int k = 0; k < 8; ++k) qh[k] = _mm512_load_si512(u + 2368 + 64 * k);
    for (int c = 0; c < 4; ++c) {
      __m512i g[8];
      for (int k = 0; k < 8; ++k) g[k] = _mm512_load_si512(u + (8 * c + k) * 64);
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h;
        __m512i W[8];
        for (int k = 0; k < 8; ++k) {
          W[k] = _mm512_and_si512(h ? _mm512_srli_epi16(g[k], 4) : g[k], m4);
          if constexpr (FIVE) {
            const __m512i hb = j <= 4 ? _mm512_slli_epi32(qh[k], 4 - j) : _mm512_srli_epi32(qh[k], j - 4);
            W[k] = _mm512_ternarylogic_epi32(W[k], hb, b4, 0xF8);  // W | (hb & b4)
          }
        }
        const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 2112 + 16 * j)));
        const __m512i mn = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 2240 + 16 * j)));
        f(j, W, _mm512_castsi512_ps(sc), _mm512_castsi512_ps(mn), _mm512_castsi512_ps(dd));
      }
    }
  }
};
using PkK = PkKq<false>;
using PkQ5K = PkKq<true>;

// One Q6_K super-block of a packed panel (the Q6_K unit of weight_pack.h):
// the levels and per-16 scales exactly as UnpackQ6K forms them from the file.
struct PkQ6K {
  static constexpr int64_t UB = 3392;
  static constexpr bool kSuper = true, kMin = false, kNib = false;
  template <class F>
  static inline void unit(const uint8_t* u, F&& f) {
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 3328)));
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03);
    for (int chunk = 0; chunk < 2; ++chunk) {
      __m512i ql[16], qh[8];
      for (int v = 0; v < 16; ++v) ql[v] = _mm512_load_si512(u + (16 * chunk + v) * 64);
      for (int v = 0; v < 8; ++v) qh[v] = _mm512_load_si512(u + 2048 + (8 * chunk + v) * 64);
      for (int uu = 0; uu < 4; ++uu) {
        const int t8 = 4 * chunk + uu;
        const __m512i* lq = ql + 8 * (uu & 1);
        __m512i W[8];
        for (int k = 0; k < 8; ++k) {
          const __m512i lo = _mm512_and_si512(uu >> 1 ? _mm512_srli_epi16(lq[k], 4) : lq[k], m4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(qh[k], 2 * uu), m3);
          W[k] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
        }
        __m512 s[2];  // as UnpackQ6K: int8 scales as int32 lanes, then d
        for (int h = 0; h < 2; ++h) {
          const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(u + 3072 + 16 * (2 * t8 + h)));
          s[h] = _mm512_castsi512_ps(_mm512_cvtepi8_epi32(b));
        }
        f(t8, W, s[0], s[1], d);
      }
    }
  }
};

// Bytes of one super-block unit of a packed K-quant panel row (Q4_K, Q5_K,
// anything else: Q6_K).
inline int64_t super_unit_bytes(GgmlType t) {
  return t == GgmlType::Q4_K ? PkK::UB : t == GgmlType::Q5_K ? PkQ5K::UB : PkQ6K::UB;
}

// ------------------------------------------------------------ block kernel
// (shared by the file-layout and the packed-layout drivers)

inline __m512i bcast4(const int8_t* q) {
  int32_t v;
  std::memcpy(&v, q, 4);
  return _mm512_set1_epi32(v);
}

// One weight block against one activation block: the float chain step of
// matmul_internal.h for all 16 lanes (K-quants run kblock).
template <bool SUPER, bool MIN>
inline __m512 block_step(const __m512i* W, __m512 ws0, __m512 ws1, __m512 wm, const XBlock& xb,
                         __m512 acc) {
  static_assert(!SUPER, "K-quants sum a super-block first: kblock");
  (void)ws1;
  const __m512 xd = _mm512_set1_ps(xb.d);
  // Two chains to halve the dpbusd latency; integer adds are exact.
  __m512i s0 = _mm512_set1_epi32(xb.corr[0]), s1 = _mm512_setzero_si512();
  for (int k = 0; k < 8; k += 2) {
    s0 = _mm512_dpbusd_epi32(s0, W[k], bcast4(xb.q + 4 * k));
    s1 = _mm512_dpbusd_epi32(s1, W[k + 1], bcast4(xb.q + 4 * k + 4));
  }
  const __m512i s = _mm512_add_epi32(s0, s1);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(ws0, xd), acc);
  if (MIN) acc = _mm512_fmadd_ps(wm, _mm512_set1_ps(xb.s), acc);
  return acc;
}

// A super-block's integer sums so far: S, and M for the formats with a min.
struct KSum {
  __m512i s, m;
  __m512i even;  // Q4_K / Q5_K: the even block's mins, until the odd one pairs them
  __m512i h;     // Q4_K (kblock's NIB): the second halves' sum
};

// Block j (0..7) of a K-quant super-block (SUPER). The block's exact
// integer steps go into the super-block sums S (and M), and the last block
// adds the float steps of matmul_internal.h.
//   Q6_K: ws0 / ws1 carry the halves' int8 scales as int32 lanes, wm the
//         super-block's d.
//   Q4_K / Q5_K (MIN): ws0 carries sc_j and ws1 m_j as int32 lanes, wm d
//         and dmin as each lane's fp16 pair.
// Every other format: block_step (S unused).
// Q4_K / Q5_K, one block: sc_j * isum_j (ws0: sc_j as int32 lanes; their
// level offset is 0, so no correction).
inline __m512i kmin_scaled(const __m512i* W, __m512 ws0, const XBlock& xb) {
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();  // two chains: half the dpbusd latency
  for (int k = 0; k < 8; k += 2) {
    s0 = _mm512_dpbusd_epi32(s0, W[k], bcast4(xb.q + 4 * k));
    s1 = _mm512_dpbusd_epi32(s1, W[k + 1], bcast4(xb.q + 4 * k + 4));
  }
  return _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), _mm512_castps_si512(ws0));
}
// m_j * xsum_j (mins: m_j < 64 in the low half of each dword; |xsum_j| < 2^15).
inline __m512i kmin_min(__m512i mins, const XBlock& xb) {
  return _mm512_madd_epi16(mins, _mm512_set1_epi32(xb.corr[1] & 0xFFFF));
}
// The mins of a super-block's 8 blocks in a scratch slice (block j's m_j
// as int32 lanes at s0 + j * stride + 576) as int16 pairs (m_2p, m_2p+1),
// for vpdpwssd against xsum_pair.
inline void kmin_pairs(const uint8_t* s0, int64_t stride, __m512i* mp) {
  for (int p = 0; p < 4; ++p)
    mp[p] = _mm512_or_si512(_mm512_load_si512(s0 + 2 * p * stride + 576),
                            _mm512_slli_epi32(_mm512_load_si512(s0 + (2 * p + 1) * stride + 576), 16));
}
// Blocks xb[0], xb[1]'s level sums as one broadcast int16 pair.
inline __m512i xsum_pair(const XBlock* xb) {
  return _mm512_set1_epi32(int32_t((uint32_t(xb[0].corr[1]) & 0xFFFF) | (uint32_t(xb[1].corr[1]) << 16)));
}
// Q4_K / Q5_K, the super-block's float steps (dd: d and dmin as each lane's fp16 pair).
inline __m512 kmin_finish(__m512i S, __m512i M, __m512i dd, float xd, __m512 acc) {
  const __m512 x = _mm512_set1_ps(xd);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(half_lo(dd), x), acc);
  const __m512 nd = _mm512_xor_ps(half_hi(dd), _mm512_set1_ps(-0.0f));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(nd, x), acc);
}

// NIB (Q4_K's 4-bit levels): a half block's sum is below 2^15, so each
// half scales by sc_j in one vpdpwssd (sc_j in the low half of its dword),
// into two sums (the halves') merged at the super-block's end.
template <bool SUPER, bool MIN, bool NIB = false>
inline __m512 kblock(const __m512i* W, __m512 ws0, __m512 ws1, __m512 wm, const XBlock& xb, int j, KSum& S,
                     __m512 acc) {
  if constexpr (!SUPER) {
    return block_step<false, MIN>(W, ws0, ws1, wm, xb, acc);
  } else if constexpr (MIN) {
    if constexpr (NIB) {
      __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        lo = _mm512_dpbusd_epi32(lo, W[k], bcast4(xb.q + 4 * k));
        hi = _mm512_dpbusd_epi32(hi, W[k + 4], bcast4(xb.q + 16 + 4 * k));
      }
      const __m512i sc = _mm512_castps_si512(ws0);
      S.s = j == 0 ? _mm512_madd_epi16(lo, sc) : _mm512_dpwssd_epi32(S.s, lo, sc);
      S.h = j == 0 ? _mm512_madd_epi16(hi, sc) : _mm512_dpwssd_epi32(S.h, hi, sc);
      if (j == kSuperBlocks - 1) S.s = _mm512_add_epi32(S.s, S.h);
    } else {
      const __m512i t = kmin_scaled(W, ws0, xb);
      S.s = j == 0 ? t : _mm512_add_epi32(S.s, t);
    }
    if (j % 2 == 0) {  // the mins go in pairs: one vpdpwssd per two blocks (xb: a row's contiguous blocks)
      S.even = _mm512_castps_si512(ws1);
      return acc;
    }
    const __m512i pair = _mm512_or_si512(S.even, _mm512_slli_epi32(_mm512_castps_si512(ws1), 16));
    S.m = j == 1 ? _mm512_madd_epi16(pair, xsum_pair(&xb - 1)) : _mm512_dpwssd_epi32(S.m, pair, xsum_pair(&xb - 1));
    if (j != kSuperBlocks - 1) return acc;
    return kmin_finish(S.s, S.m, _mm512_castps_si512(wm), xb.d, acc);
  } else {
    __m512i lo = _mm512_set1_epi32(xb.corr[0]), hi = _mm512_set1_epi32(xb.corr[1]);
    for (int k = 0; k < 4; ++k) {
      lo = _mm512_dpbusd_epi32(lo, W[k], bcast4(xb.q + 4 * k));
      hi = _mm512_dpbusd_epi32(hi, W[k + 4], bcast4(xb.q + 16 + 4 * k));
    }
    const __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(lo, _mm512_castps_si512(ws0)),
                                       _mm512_mullo_epi32(hi, _mm512_castps_si512(ws1)));
    S.s = j == 0 ? t : _mm512_add_epi32(S.s, t);
    if (j != kSuperBlocks - 1) return acc;
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(S.s), _mm512_mul_ps(wm, _mm512_set1_ps(xb.d)), acc);
  }
}

}  // namespace kvs::mm::avx512_detail

KVS_TARGET_END()
