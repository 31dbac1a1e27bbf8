// AVX2 weight unpackers for matmul_avx2.cpp (include it from there only).
// Same contract as matmul_avx512_unpack.h with 8-row panels (one row per ymm
// lane): per 32-element block j of a unit, `f(j, W, ws0, ws1, wm)` with
// W[k] lane r = levels of elements 4k..4k+3 of row r. Levels are u = q + off,
// except Q8_0 which stays signed (maddubs needs u8 <= 128 against the
// activations, so the kernel uses the abs/sign trick; see qformat()).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/matmul_avx2_block.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

KVS_TARGET_BEGIN("avx2,fma,f16c,bmi,bmi2,popcnt")

namespace kvs::mm::avx2_detail {

constexpr int L = 8;  // rows per panel

struct Panel {
  const uint8_t* rp[L];  // row pointers per lane (past the end: the last row again)
  const uint8_t* base;   // rp[0]
  __m256i gidx;          // rp[lane] - base as int32, for gathers
  int nvalid;            // lanes holding real rows
};

inline void make_panel(const WeightView& w, int64_t p0, int64_t r1, Panel* p) {
  const int64_t nvalid = r1 - p0 < L ? r1 - p0 : L;
  alignas(32) int32_t off[L];
  for (int lane = 0; lane < L; ++lane) {
    const int64_t r = lane < nvalid ? lane : nvalid - 1;
    p->rp[lane] = w.row(p0 + r);
    off[lane] = int32_t(r * int64_t(w.row_stride));
  }
  p->base = p->rp[0];
  p->gidx = _mm256_load_si256(reinterpret_cast<const __m256i*>(off));
  p->nvalid = int(nvalid);
}

inline __m128i ld16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// 16 bytes at `off` of every row: g[k] lane r = dword k of row r.
inline void load_rows16(const Panel& p, int64_t off, __m256i* g) {
  __m256i a[4];
  for (int j = 0; j < 4; ++j)
    a[j] = _mm256_inserti128_si256(_mm256_castsi128_si256(ld16(p.rp[j] + off)), ld16(p.rp[j + 4] + off), 1);
  const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
  g[0] = _mm256_unpacklo_epi64(t0, t2);
  g[1] = _mm256_unpackhi_epi64(t0, t2);
  g[2] = _mm256_unpacklo_epi64(t1, t3);
  g[3] = _mm256_unpackhi_epi64(t1, t3);
}

inline __m256i gather32(const Panel& p, int64_t off) {
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(p.base + off), p.gidx, 1);
}

inline void nibbles(const __m256i* g, __m256i* W) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k) {
    W[k] = _mm256_and_si256(g[k], m4);
    W[k + 4] = _mm256_and_si256(_mm256_srli_epi16(g[k], 4), m4);
  }
}

// Adds 16 to byte i of every lane of w where bit (base + i) of the lane's word q is set.
inline __m256i add_bit4(__m256i w, __m256i q, int base) {
  const int byte = base / 8, sh = base % 8;
  const int32_t b = byte * 0x01010101;
  const __m256i ctrl = _mm256_setr_epi32(b, b + 0x04040404, b + 0x08080808, b + 0x0C0C0C0C, b,
                                         b + 0x04040404, b + 0x08080808, b + 0x0C0C0C0C);
  const __m256i sel = _mm256_set1_epi32(0x08040201 << sh);
  const __m256i hit = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(q, ctrl), sel), sel);
  return _mm256_or_si256(w, _mm256_and_si256(hit, _mm256_set1_epi8(16)));
}

struct UnpackQ4_0 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = false, kSigned = false, kNibble = true;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockQ4_0));
    __m256i g[4], W[8];
    load_rows16(p, o + 2, g);
    nibbles(g, W);
    const __m256 ws = half_lo(gather32(p, o));
    f(0, W, ws, ws, ws);
  }
};

struct UnpackQ4_1 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = true, kSigned = false, kNibble = true;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockQ4_1));
    __m256i g[4], W[8];
    load_rows16(p, o + 4, g);
    nibbles(g, W);
    const __m256i dm = gather32(p, o);
    f(0, W, half_lo(dm), half_lo(dm), half_hi(dm));
  }
};

template <bool ONE>
struct UnpackQ5 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = ONE, kSigned = false;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(ONE ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
    const int64_t qh_off = ONE ? 4 : 2;
    __m256i g[4], W[8];
    load_rows16(p, o + qh_off + 4, g);
    nibbles(g, W);
    const __m256i qh = gather32(p, o + qh_off);
    for (int k = 0; k < 4; ++k) {
      W[k] = add_bit4(W[k], qh, 4 * k);
      W[k + 4] = add_bit4(W[k + 4], qh, 16 + 4 * k);
    }
    const __m256i dm = gather32(p, o);
    const __m256 ws = half_lo(dm);
    f(0, W, ws, ws, ONE ? half_hi(dm) : ws);
  }
};

// MXFP4: the codes are nibbles laid out as Q4_0's, looked up to u = value + 12.
struct UnpackMXFP4 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = false, kSigned = false, kSmall = true;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockMXFP4));
    __m256i g[4], W[8];
    load_rows16(p, o + 1, g);
    nibbles(g, W);
    const __m256i tbl = mxfp4_table();
    for (int k = 0; k < 8; ++k) W[k] = _mm256_shuffle_epi8(tbl, W[k]);
    // The gathered dword starts at e; its other three bytes are codes.
    const __m256 ws = e8m0_half_ps(_mm256_and_si256(gather32(p, o), _mm256_set1_epi32(0xFF)));
    f(0, W, ws, ws, ws);
  }
};

struct UnpackQ8_0 {
  static constexpr int kBlocks = 1;
  static constexpr bool kSuper = false, kMin = false, kSigned = true;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockQ8_0));
    __m256i W[8];
    load_rows16(p, o + 2, W);
    load_rows16(p, o + 18, W + 4);
    const __m256 ws = half_lo(gather32(p, o));
    f(0, W, ws, ws, ws);
  }
};

inline __m256i kbyte(const __m256i* s, int i) {
  return _mm256_and_si256(_mm256_srli_epi32(s[i / 4], 8 * (i % 4)), _mm256_set1_epi32(0xFF));
}

// sc_j and m_j as int32 lanes, d / dmin as each lane's fp16 pair (kblock).
inline void k4_scales(const Panel& p, int64_t o, __m256i* ws, __m256i* wm, __m256i* dd) {
  *dd = gather32(p, o);
  __m256i s[3];
  for (int i = 0; i < 3; ++i) s[i] = gather32(p, o + 4 + 4 * i);
  const __m256i m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi32(15);
  for (int j = 0; j < 8; ++j) {
    __m256i sc, mn;
    if (j < 4) {
      sc = _mm256_and_si256(kbyte(s, j), m63);
      mn = _mm256_and_si256(kbyte(s, j + 4), m63);
    } else {
      const __m256i hi = kbyte(s, j + 4);
      sc = _mm256_or_si256(_mm256_and_si256(hi, m15), _mm256_slli_epi32(_mm256_srli_epi32(kbyte(s, j - 4), 6), 4));
      mn = _mm256_or_si256(_mm256_srli_epi32(hi, 4), _mm256_slli_epi32(_mm256_srli_epi32(kbyte(s, j), 6), 4));
    }
    ws[j] = sc;
    wm[j] = mn;
  }
}

template <bool FIVE>
struct UnpackQK {
  static constexpr int kBlocks = 8;
  static constexpr bool kSuper = true, kMin = true, kSigned = false, kNibble = !FIVE, kSmall = FIVE;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(FIVE ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
    __m256i ws[8], wm[8], dd;
    k4_scales(p, o, ws, wm, &dd);
    __m256i qh[8];
    if (FIVE) {
      load_rows16(p, o + 16, qh);
      load_rows16(p, o + 32, qh + 4);
    }
    const int64_t qs_off = o + 16 + (FIVE ? 32 : 0);
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    for (int c = 0; c < 4; ++c) {
      __m256i g[8];
      load_rows16(p, qs_off + 32 * c, g);
      load_rows16(p, qs_off + 32 * c + 16, g + 4);
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h;
        __m256i W[8];
        for (int k = 0; k < 8; ++k) {
          W[k] = _mm256_and_si256(h ? _mm256_srli_epi16(g[k], 4) : g[k], m4);
          if (FIVE) {
            const __m256i hb = j <= 4 ? _mm256_slli_epi32(qh[k], 4 - j) : _mm256_srli_epi32(qh[k], j - 4);
            W[k] = _mm256_or_si256(W[k], _mm256_and_si256(hb, b4));
          }
        }
        f(j, W, _mm256_castsi256_ps(ws[j]), _mm256_castsi256_ps(wm[j]), _mm256_castsi256_ps(dd));
      }
    }
  }
};

struct UnpackQ6K {
  static constexpr int kBlocks = 8;
  static constexpr bool kSuper = true, kMin = false, kSigned = false;
  template <class F>
  static inline void unit(const Panel& p, int64_t u, F&& f) {
    const int64_t o = u * int64_t(sizeof(BlockQ6_K));
    const __m256 d = half_lo(gather32(p, o + 208));
    __m256i sc[4];
    for (int i = 0; i < 4; ++i) sc[i] = gather32(p, o + 192 + 4 * i);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
    for (int chunk = 0; chunk < 2; ++chunk) {
      __m256i ql[16], qh[8];
      for (int i = 0; i < 4; ++i) load_rows16(p, o + 64 * chunk + 16 * i, ql + 4 * i);
      load_rows16(p, o + 128 + 32 * chunk, qh);
      load_rows16(p, o + 128 + 32 * chunk + 16, qh + 4);
      for (int uu = 0; uu < 4; ++uu) {
        const int t8 = 4 * chunk + uu;
        const __m256i* lq = ql + 8 * (uu & 1);
        __m256i W[8];
        for (int k = 0; k < 8; ++k) {
          const __m256i lo = _mm256_and_si256(uu >> 1 ? _mm256_srli_epi16(lq[k], 4) : lq[k], m4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh[k], 2 * uu), m3);
          W[k] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        }
        __m256 s[2];  // the halves' int8 scales as int32 lanes, then d (kblock)
        for (int h = 0; h < 2; ++h) {
          const int i = 2 * t8 + h;
          s[h] = _mm256_castsi256_ps(_mm256_srai_epi32(_mm256_slli_epi32(sc[i / 4], 24 - 8 * (i % 4)), 24));
        }
        f(t8, W, s[0], s[1], d);
      }
    }
  }
};

}  // namespace kvs::mm::avx2_detail

KVS_TARGET_END()
