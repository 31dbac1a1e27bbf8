// AVX2 block kernel shared by the file-layout (matmul_avx2.cpp) and Panel8
// (matmul_avx2_packed.cpp) drivers: the exact integer dot of one 32-element
// block for 8 rows, the fixed float chain step of matmul_internal.h, and the
// GEMM tiles over an unpacked scratch slice. Include from those files only
// (and bench/bench_tiles.cpp, which times the block kernels in L1).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

KVS_TARGET_BEGIN("avx2,fma,f16c,bmi,bmi2,popcnt")

namespace kvs::mm::avx2_detail {

constexpr int KB = 32;  // 32-element blocks per scratch panel slice
constexpr int R = 4;    // activation rows per GEMM register tile
// Scratch layout of one unpacked block: W[8] then ws0, ws1, wm (8 floats each).
constexpr size_t kPanelBlockBytes = 8 * 32 + 3 * 32;  // 352

// ------------------------------------------------------------ block kernel

// fp16 in the low half of each dword -> float (packus is exact on 0..65535).
inline __m256 half_lo(__m256i g) {
  const __m256i h = _mm256_and_si256(g, _mm256_set1_epi32(0xFFFF));
  const __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(pk));
}
inline __m256 half_hi(__m256i g) { return half_lo(_mm256_srli_epi32(g, 16)); }

inline __m256i bcast4(const int8_t* q) {
  int32_t v;
  std::memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}

// Exact int32 dot of groups [k0, k0 + 4) (16 elements) for every lane.
template <bool SIGNED>
inline __m256i dot16(const __m256i* W, const int8_t* xq, int k0, __m256i acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  if (SIGNED) {
    for (int k = k0; k < k0 + 4; ++k) {
      const __m256i x = bcast4(xq + 4 * k);
      const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(W[k]), _mm256_sign_epi8(x, W[k]));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
  } else {
    for (int k = k0; k < k0 + 4; k += 2) {
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(W[k], bcast4(xq + 4 * k)),
                                         _mm256_maddubs_epi16(W[k + 1], bcast4(xq + 4 * k + 4)));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
  }
  return acc;
}

// Exact int32 dot of a whole block for 4-bit levels (u <= 15): a maddubs
// pair is at most 2 * 15 * 127, so all eight sum in int16 without overflow
// and one widening madd replaces four (the multiply ports bound prefill).
inline __m256i dot32_nibble(const __m256i* W, const int8_t* xq, __m256i acc) {
  __m256i p = _mm256_maddubs_epi16(W[0], bcast4(xq));
  for (int k = 1; k < 8; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(W[k], bcast4(xq + 4 * k)));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

// Exact int32 dot of a whole block for levels u <= 31 (MXFP4's 0..24): a
// maddubs pair is at most 2 * 31 * 127, so four sum in int16 and two
// widening madds replace four.
inline __m256i dot32_small(const __m256i* W, const int8_t* xq, __m256i acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 8; h += 4) {
    __m256i p = _mm256_maddubs_epi16(W[h], bcast4(xq + 4 * h));
    for (int k = h + 1; k < h + 4; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(W[k], bcast4(xq + 4 * k)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
  }
  return acc;
}

// Unpackers whose levels are 4-bit declare kNibble = true; those whose
// levels stay below 32, kSmall = true.
template <class U, class = void>
struct NibbleLevels : std::false_type {};
template <class U>
struct NibbleLevels<U, std::void_t<decltype(U::kNibble)>> : std::bool_constant<U::kNibble> {};
template <class U, class = void>
struct SmallLevels : std::false_type {};
template <class U>
struct SmallLevels<U, std::void_t<decltype(U::kSmall)>> : std::bool_constant<U::kSmall> {};
// Bits the unsigned levels of U need (4, 5 or 8): block_step's BITS.
template <class U>
constexpr int kLevelBits = NibbleLevels<U>::value ? 4 : SmallLevels<U>::value ? 5 : 8;

// The float chain step of matmul_internal.h for all 8 lanes. BITS (4, 5 or
// 8: kLevelBits) picks how many products sum in int16 before widening.
template <bool SUPER, bool MIN, bool SIGNED, int BITS = 8>
inline __m256 block_step(const __m256i* W, __m256 ws0, __m256 ws1, __m256 wm, const XBlock& xb,
                         __m256 acc) {
  static_assert(BITS == 4 || BITS == 5 || BITS == 8, "BITS is a level width (kLevelBits)");
  static_assert(!SUPER, "K-quants sum a super-block first: kblock");
  (void)ws1;
  const __m256 xd = _mm256_set1_ps(xb.d);
  if (BITS < 8 && !SUPER && !SIGNED) {
    const __m256i c = _mm256_set1_epi32(xb.corr[0]);
    const __m256i s = BITS == 4 ? dot32_nibble(W, xb.q, c) : dot32_small(W, xb.q, c);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(ws0, xd), acc);
  } else {
    const __m256i s0 = dot16<SIGNED>(W, xb.q, 0, _mm256_set1_epi32(xb.corr[0]));
    const __m256i s1 = dot16<SIGNED>(W, xb.q, 4, _mm256_setzero_si256());
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), _mm256_mul_ps(ws0, xd), acc);
  }
  if (MIN) acc = _mm256_fmadd_ps(wm, _mm256_set1_ps(xb.s), acc);
  return acc;
}

// Q4_K / Q5_K (level offset 0, no correction): sc_j * isum_j for one
// block. The int16 sums of the maddubs pairs (eight for 4-bit levels, four
// for 5-bit: below 2^15 either way) widen in a multiply by sc_j, given as
// sc16 = sc_j in both halves of each dword, so no vpmulld is needed.
inline __m256i sc_pairs(__m256 ws0) {
  const __m256i sc = _mm256_castps_si256(ws0);
  return _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
}
template <int BITS>
inline __m256i kmin_scaled(const __m256i* W, __m256i sc16, const int8_t* q) {
  static_assert(BITS == 4 || BITS == 5, "K-quant levels with a min have 4 or 5 bits");
  constexpr int G = BITS == 4 ? 8 : 4;  // maddubs pairs per widening
  __m256i t = _mm256_setzero_si256();
  for (int h = 0; h < 8; h += G) {
    __m256i p = _mm256_maddubs_epi16(W[h], bcast4(q + 4 * h));
    for (int k = h + 1; k < h + G; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(W[k], bcast4(q + 4 * k)));
    t = _mm256_add_epi32(t, _mm256_madd_epi16(p, sc16));
  }
  return t;
}
// m_j * xsum_j: m_j < 64 in the low half of each dword, |xsum_j| < 2^15.
// The mins of a super-block in a scratch slice (block j's m_j as int32
// lanes at s0 + j * stride + 288) as int16 pairs (m_2p, m_2p+1).
inline void kmin_pairs(const uint8_t* s0, int64_t stride, __m256i* mp) {
  for (int p = 0; p < 4; ++p)
    mp[p] = _mm256_or_si256(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(s0 + 2 * p * stride + 288)),
        _mm256_slli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(s0 + (2 * p + 1) * stride + 288)), 16));
}
// Blocks xb[0], xb[1]'s level sums as one broadcast int16 pair.
inline __m256i xsum_pair(const XBlock* xb) {
  return _mm256_set1_epi32(int32_t((uint32_t(xb[0].corr[1]) & 0xFFFF) | (uint32_t(xb[1].corr[1]) << 16)));
}
// The super-block's float steps (dd: d and dmin as each lane's fp16 pair).
inline __m256 kmin_finish(__m256i S, __m256i M, __m256i dd, float xd, __m256 acc) {
  const __m256 x = _mm256_set1_ps(xd);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_mul_ps(half_lo(dd), x), acc);
  const __m256 nd = _mm256_xor_ps(half_hi(dd), _mm256_set1_ps(-0.0f));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(nd, x), acc);
}

// A super-block's integer sums so far: S, and M for the formats with a min.
struct KSum {
  __m256i s, m;
};

// Block j (0..7) of a K-quant super-block (SUPER). The block's exact
// integer steps go into the super-block sums S (and M), and the last block
// adds the float steps of matmul_internal.h.
//   Q6_K: ws0 / ws1 carry the halves' int8 scales as int32 lanes, wm the
//         super-block's d.
//   Q4_K / Q5_K (MIN): ws0 carries sc_j and ws1 m_j as int32 lanes, wm d
//         and dmin as each lane's fp16 pair.
// Every other format: block_step (S unused).
template <bool SUPER, bool MIN, bool SIGNED, int BITS = 8>
inline __m256 kblock(const __m256i* W, __m256 ws0, __m256 ws1, __m256 wm, const XBlock& xb, int j, KSum& S,
                     __m256 acc) {
  if constexpr (!SUPER) {
    return block_step<false, MIN, SIGNED, BITS>(W, ws0, ws1, wm, xb, acc);
  } else if constexpr (MIN) {
    const __m256i t = kmin_scaled<BITS>(W, sc_pairs(ws0), xb.q);
    const __m256i u = _mm256_madd_epi16(_mm256_castps_si256(ws1), _mm256_set1_epi32(xb.corr[1] & 0xFFFF));
    S.s = j == 0 ? t : _mm256_add_epi32(S.s, t);
    S.m = j == 0 ? u : _mm256_add_epi32(S.m, u);
    if (j != kSuperBlocks - 1) return acc;
    return kmin_finish(S.s, S.m, _mm256_castps_si256(wm), xb.d, acc);
  } else {
    const __m256i lo = dot16<SIGNED>(W, xb.q, 0, _mm256_set1_epi32(xb.corr[0]));
    const __m256i hi = dot16<SIGNED>(W, xb.q, 4, _mm256_set1_epi32(xb.corr[1]));
    const __m256i t = _mm256_add_epi32(_mm256_mullo_epi32(lo, _mm256_castps_si256(ws0)),
                                       _mm256_mullo_epi32(hi, _mm256_castps_si256(ws1)));
    S.s = j == 0 ? t : _mm256_add_epi32(S.s, t);
    if (j != kSuperBlocks - 1) return acc;
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(S.s), _mm256_mul_ps(wm, _mm256_set1_ps(xb.d)), acc);
  }
}

// Half the E8M0 scale per lane, 2^(e - 128), from e (0..255) in each
// dword: e8m0_half() of quant.h lane by lane, the subnormals of e < 2 included.
inline __m256 e8m0_half_ps(__m256i e) {
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
  const __m256i lt2 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, lt2));
}

// kMxfp4Levels in both 128-bit lanes: vpshufb turns MXFP4 codes into levels u.
inline __m256i mxfp4_table() {
  return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Levels.u)));
}

inline __m256i lane_mask(int nvalid) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(nvalid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}


// One unit of unpacked blocks into scratch: `p` is whatever U::unit reads
// (a file-layout Panel, or a Panel8 panel pointer).
template <class U, class Src>
inline void unpack_to_scratch(const Src& p, int64_t u, uint8_t* dst) {
  U::unit(p, u, [&](int j, const __m256i* W, __m256 ws0, __m256 ws1, __m256 wm) {
    uint8_t* o = dst + j * kPanelBlockBytes;
    for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(o + 32 * k), W[k]);
    _mm256_store_ps(reinterpret_cast<float*>(o + 256), ws0);
    _mm256_store_ps(reinterpret_cast<float*>(o + 288), ws1);
    _mm256_store_ps(reinterpret_cast<float*>(o + 320), wm);
  });
}

// Signed 8-bit levels (Q8_0) of one block for RT activation rows: each
// weight vector is loaded and made absolute once for all rows, and every row
// keeps its block sum in a register, where block_step's per-row calls
// re-derived |W| for every row and spilled the accumulators. The integer sum
// is exact in any order and the float step is block_step's, so the bits are
// the same. `levels` holds the block's 8 vectors (32-byte aligned).
template <int RT>
inline void signed_block_rows(const uint8_t* levels, __m256 ws0, const XBlock* const (&xb)[RT],
                              __m256 (&acc)[RT]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum[RT];
  for (int i = 0; i < RT; ++i) sum[i] = _mm256_set1_epi32(xb[i]->corr[0]);
  for (int k = 0; k < 8; ++k) {
    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(levels + 32 * k));
    const __m256i a = _mm256_abs_epi8(w);
    for (int i = 0; i < RT; ++i) {
      const __m256i p = _mm256_maddubs_epi16(a, _mm256_sign_epi8(bcast4(xb[i]->q + 4 * k), w));
      sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(p, ones));
    }
  }
  for (int i = 0; i < RT; ++i)
    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i]), _mm256_mul_ps(ws0, _mm256_set1_ps(xb[i]->d)), acc[i]);
}

// signed_block_rows over a scratch slice of kb unpacked blocks.
template <int RT>
inline void signed_blocks(const uint8_t* slice, int64_t kb0, int64_t kb, const XBlock* xq, int64_t nb,
                          int64_t i0, __m256 (&acc)[RT]) {
  for (int64_t bb = 0; bb < kb; ++bb) {
    const uint8_t* s = slice + bb * kPanelBlockBytes;
    const XBlock* xb[RT];
    for (int i = 0; i < RT; ++i) xb[i] = &xq[(i0 + i) * nb + kb0 + bb];
    signed_block_rows<RT>(s, _mm256_load_ps(reinterpret_cast<const float*>(s + 256)), xb, acc);
  }
}

template <int RT, class U>
void tile_from_scratch(const uint8_t* slice, int64_t kb0, int64_t kb, const XBlock* xq, int64_t nb,
                       int64_t i0, float* y, int64_t ldy, int64_t p0, __m256i mask) {
  __m256 acc[RT];
  for (int i = 0; i < RT; ++i)
    acc[i] = kb0 == 0 ? _mm256_setzero_ps() : _mm256_maskload_ps(y + (i0 + i) * ldy + p0, mask);
  if constexpr (U::kSigned && !U::kSuper && !U::kMin && kLevelBits<U> == 8) {
    signed_blocks<RT>(slice, kb0, kb, xq, nb, i0, acc);
    for (int i = 0; i < RT; ++i) _mm256_maskstore_ps(y + (i0 + i) * ldy + p0, mask, acc[i]);
    return;
  }
  KSum S[RT];  // K-quants: super-block sums (kblock; slices hold whole super-blocks)
  for (int64_t bb = 0; bb < kb; ++bb) {
    const uint8_t* s = slice + bb * kPanelBlockBytes;
    __m256i W[8];
    for (int k = 0; k < 8; ++k) W[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(s + 32 * k));
    const __m256 ws0 = _mm256_load_ps(reinterpret_cast<const float*>(s + 256));
    if constexpr (U::kSuper && U::kMin) {  // Q4_K / Q5_K: the mins' sum from the slice at the super-block's end
      const int j = int(bb % kSuperBlocks);
      const __m256i sc16 = sc_pairs(ws0);
      for (int i = 0; i < RT; ++i) {
        const __m256i t = kmin_scaled<kLevelBits<U>>(W, sc16, xq[(i0 + i) * nb + kb0 + bb].q);
        S[i].s = j == 0 ? t : _mm256_add_epi32(S[i].s, t);
      }
      if (j != kSuperBlocks - 1) continue;
      __m256i mp[4];
      kmin_pairs(s - j * kPanelBlockBytes, kPanelBlockBytes, mp);
      const __m256i dd = _mm256_load_si256(reinterpret_cast<const __m256i*>(s + 320));
      for (int i = 0; i < RT; ++i) {
        const XBlock* xb = xq + (i0 + i) * nb + kb0 + bb - j;
        __m256i M = _mm256_madd_epi16(mp[0], xsum_pair(xb));
        for (int p = 1; p < 4; ++p) M = _mm256_add_epi32(M, _mm256_madd_epi16(mp[p], xsum_pair(xb + 2 * p)));
        acc[i] = kmin_finish(S[i].s, M, dd, xb[0].d, acc[i]);
      }
      continue;
    }
    const __m256 ws1 = _mm256_load_ps(reinterpret_cast<const float*>(s + 288));
    const __m256 wm = _mm256_load_ps(reinterpret_cast<const float*>(s + 320));
    for (int i = 0; i < RT; ++i)
      acc[i] = kblock<U::kSuper, U::kMin, U::kSigned, kLevelBits<U>>(W, ws0, ws1, wm, xq[(i0 + i) * nb + kb0 + bb],
                                                                     int(bb % kSuperBlocks), S[i], acc[i]);
  }
  for (int i = 0; i < RT; ++i) _mm256_maskstore_ps(y + (i0 + i) * ldy + p0, mask, acc[i]);
}


}  // namespace kvs::mm::avx2_detail

KVS_TARGET_END()
