// One step of the K-quant tile kernel (matmul_amx_super.cpp, whose head
// says what it computes): the slice layout, a super-block's tile products
// and stores, and its float chain. A header so that
// bench/bench_amx_overlap.cpp times these very steps.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/matmul_amx_tiles.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c,bmi,bmi2,popcnt,amx-tile,amx-int8")

namespace kvs::mm::super_step {

// A slice in scratch, per super-block: the lo bytes [4][16, 64], the hi
// bytes [4][16, 64], then the panel's d [16 floats] and, for Q4_K / Q5_K, -dmin
// [16 floats] and the mins as int16 pairs (m_2p, m_2p+1) [4][16 dwords].
constexpr int64_t kStepBytes = 1024;
constexpr int64_t kSuperBytes = 8 * kStepBytes + 2 * 64 + 4 * 64;
inline uint8_t* lo_of(uint8_t* s, int64_t sb, int c) { return s + sb * kSuperBytes + c * kStepBytes; }
inline uint8_t* hi_of(uint8_t* s, int64_t sb, int c) { return s + sb * kSuperBytes + (4 + c) * kStepBytes; }
inline float* d_of(uint8_t* s, int64_t sb) { return reinterpret_cast<float*>(s + sb * kSuperBytes + 8 * kStepBytes); }
inline float* nd_of(uint8_t* s, int64_t sb) { return d_of(s, sb) + 16; }
inline int32_t* mins_of(uint8_t* s, int64_t sb) { return reinterpret_cast<int32_t*>(d_of(s, sb) + 32); }

// Super-block i's products on C set i % 2 (tiles 0/1, 2/3). A tile load
// waits for the products that read its register before it (the tile
// registers behave as if not renamed), so the A tiles alternate between 4
// and 5 step by step and the lo and hi bytes have a register each (6, 7):
// every load has a product between it and the last reader of its
// register, and runs while that product does. (A ring of three C sets with
// one A and one B register measured slower: each load there waited for
// the product just issued.) between(c) runs after step c: the caller puts
// a quarter of the previous super-block's float chain there, because tile
// loads and stores hold up the vector work issued after them, and a
// chain issued in one piece after the products waited for most of them.
#define KVS_STEP(CL, CH, A, c)                      \
  KVS_TILE_LOAD(A, &x->q[0][64 * c], 256, 3904);    \
  KVS_TILE_LOAD(6, lo_of(slice, sb, c), 64, 1024);  \
  _tile_dpbsud(CL, A, 6);                           \
  KVS_TILE_LOAD(7, hi_of(slice, sb, c), 64, 1024);  \
  _tile_dpbssd(CH, A, 7);                           \
  between(c);
#define KVS_SUPER(CL, CH) \
  _tile_zero(CL);         \
  _tile_zero(CH);         \
  KVS_STEP(CL, CH, 4, 0)  \
  KVS_STEP(CL, CH, 5, 1)  \
  KVS_STEP(CL, CH, 4, 2)  \
  KVS_STEP(CL, CH, 5, 3)
template <class F>
inline __attribute__((always_inline)) void super_product(int64_t i, const XSuper* x, uint8_t* slice, int64_t sb,
                                                         F&& between) {
  if (i % 2 == 0) {
    KVS_SUPER(0, 1);
  } else {
    KVS_SUPER(2, 3);
  }
}
#undef KVS_SUPER
#undef KVS_STEP
// Stores super-block i's sums (lo at out, hi at out + 256). Issued before
// the next super-block's products, so the chain that reads them runs while
// those products do.
inline void super_store(int64_t i, int32_t* out) {
  if (i % 2 == 0) {
    KVS_TILE_STORE(0, out);
    KVS_TILE_STORE(1, out + 256);
  } else {
    KVS_TILE_STORE(2, out);
    KVS_TILE_STORE(3, out + 256);
  }
}

inline __m512i bcast_pair(const int16_t* p) {  // one dword of two int16, broadcast
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// kblock's float steps for rows [m0, m1) of one super-block, below `rows`
// (all 16 when FULL): c holds the lo sums [16, 16], c + 256 the hi ones;
// vd the panel's d, and for Q4_K / Q5_K vnd its -dmin and mp its mins (the
// slice's, from super_consts). A row range, so the caller can spread a
// super-block's rows between the next one's tile steps.
struct SuperConsts {
  __m512 vd, vnd;
  __m512i mp[4];
};
template <bool MIN>
inline __attribute__((always_inline)) SuperConsts super_consts(uint8_t* slice, int64_t sb) {
  SuperConsts k;
  k.vd = _mm512_load_ps(d_of(slice, sb));
  if constexpr (MIN) {
    k.vnd = _mm512_load_ps(nd_of(slice, sb));
    for (int p = 0; p < 4; ++p) k.mp[p] = _mm512_load_si512(mins_of(slice, sb) + 16 * p);
  }
  return k;
}
template <bool MIN, bool FULL>
inline __attribute__((always_inline)) void super_chain(const int32_t* c, const SuperConsts& k, const XSuper& x,
                                                       int rows, int m0, int m1, __m512* acc) {
#pragma GCC unroll 16
  for (int m = m0; m < m1; ++m) {
    if (!FULL && m >= rows) break;
    const __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c + 256 + 16 * m), 8),
                                       _mm512_load_si512(c + 16 * m));
    const __m512 xd = _mm512_set1_ps(x.d[m]);
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(k.vd, xd), acc[m]);
    if constexpr (MIN) {
      __m512i mm = _mm512_madd_epi16(k.mp[0], bcast_pair(x.xs[m]));
      for (int p = 1; p < 4; ++p) mm = _mm512_dpwssd_epi32(mm, k.mp[p], bcast_pair(x.xs[m] + 2 * p));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mm), _mm512_mul_ps(k.vnd, xd), acc[m]);
    }
  }
}

}  // namespace kvs::mm::super_step

KVS_TARGET_END()
