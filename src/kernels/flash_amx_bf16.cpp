// AMX-BF16 instance of the tiled attention (flash_attention.h's bf16
// variant): both products of a key tile run on bf16 tiles, the online
// softmax is flash_rows_impl.h's, in fp32 with lanes = rows, and the rows'
// m, l and outputs keep that kernel's lane layout (its finish() is reused).
//
// A call takes up to kTileBatch key tiles (tiles(); tile() is one):
//   keys    kb [16, hd] bf16 per tile, row-major
//   values  vt [hd, 16] bf16 per tile, transposed
// and runs each row group of 16 rows (lanes) over all of them in two passes:
//   1. scores and softmax, four tiles in flight:
//        S^T = kb . qb  [16 keys, 16 rows] f32, qb the group's queries
//        [hd / 2, 16, 2] bf16 (d pairs x rows, written by begin); row k of
//        S^T is s_k over the lanes; then per tile its alpha and
//        P^T [8, 16, 2] bf16 (key pairs x rows)
//   2. the outputs, O^T [hd, 16 rows] f32, 64 d at a time held in four C
//      tiles across the call: per tile, O^T = O^T * alpha (through memory,
//      only where some lane's alpha is not 1), then O^T += vt . P^T
// Compiled with -ffp-contract=off (CMakeLists.txt) like the fp32 kernels,
// whose softmax code it shares.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/amx_tile_config.h"
#include "kernels/exp_poly.h"
#include "kernels/flash_attention.h"
#include "kernels/target_region.h"

namespace kvs::attn {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,amx-tile,amx-bf16")
namespace {

#include "kernels/flash_v512.h"
#include "kernels/flash_rows_impl.h"

using R = __m512;

// Tiles:
//   0, 1  A [16, 32 B]  16 d of a tile's keys, or 16 d of its values^T
//   2, 3  B [8, 64 B]   16 d of the queries, or a tile's P^T
//   4..7  C [16, 64 B]  four tiles' S^T (pass 1), four 16-d slices of O^T (pass 2)
// A and B alternate between their two, so a load need not wait for the
// product that reads the other one.
template <int T>
inline void tload(const void* p, int64_t stride) {
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(stride), "i"(T) : "memory");
}
template <int T>
inline void tstore(void* p) {
  __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(int64_t(64)), "i"(T) : "memory");
}
template <int T>
inline void tzero() {
  __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
}
template <int C, int A, int B>
inline void dp() {
  __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
}

// Loads the configuration for one call; releases the tiles when it ends,
// so no tile state outlives the call on a pool thread.
struct Tiles {
  Tiles() {
    TileConfig c;
    for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
    c.colsb[0] = c.colsb[1] = 32;
    c.rows[2] = c.rows[3] = 8;
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
  }
  ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

// The call's work after the rows' state (flash_work_floats).
struct Work {
  float* sb;       // [4, 16, 16] scores of four tiles
  uint16_t* kb;    // [n, 16, hd]
  uint16_t* vt;    // [n, hd, 16]
  uint16_t* pb;    // [n, 8, 32]
  float* alpha;    // [n, 16]
  uint8_t* state;  // [n] kSkip / kRescale
};
constexpr uint8_t kSkip = 1, kRescale = 2;

Work work(const FlashQuery& fq, float* st) {
  const size_t lanes = size_t(fq.rows() + 15) / 16 * 16, hd = size_t(fq.hd), nb = kTileBatch;
  float* sb = st + 2 * lanes * hd + 2 * lanes;
  float* kb = sb + 1024;
  float* vt = kb + nb * 8 * hd;
  float* pb = vt + nb * 8 * hd;
  float* alpha = pb + nb * 128;
  return {sb, reinterpret_cast<uint16_t*>(kb), reinterpret_cast<uint16_t*>(vt), reinterpret_cast<uint16_t*>(pb),
          alpha, reinterpret_cast<uint8_t*>(alpha + nb * 16)};
}

// Row group g's bf16 queries (in the fp32 kernel's qt region, which is
// twice their size): pair j of d is 64 bytes, lane-interleaved.
uint16_t* qb_of(const FlashQuery& fq, float* st, int g) {
  return reinterpret_cast<uint16_t*>(st) + size_t(g) * size_t(fq.hd) * 16;
}

// bf16 of a and b interleaved by lane: a0 b0 a1 b1 ... (a B tile row).
__m512i interleave(R a, R b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

// r [16] rows of 16 floats -> r [16] columns.
inline void transpose16(R* r) {
  R t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  R u[16];  // u[4i + k], 128-bit lane L: rows 4i..4i+3 of column 4L + k
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const R x0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), x1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
    const R x2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44), x3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
    r[k] = _mm512_shuffle_f32x4(x0, x2, 0x88);
    r[4 + k] = _mm512_shuffle_f32x4(x0, x2, 0xDD);
    r[8 + k] = _mm512_shuffle_f32x4(x1, x3, 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(x1, x3, 0xDD);
  }
}

void begin_bf16(const FlashQuery& fq, float* st) {
  const flash_rows::Layout lo = flash_rows::layout<V512>(fq, st);
  const int hd = fq.hd;
  const R c = V512::set1(fq.query_factor());
  for (int g = 0; g < lo.G; ++g) {
    int off[16];
    flash_rows::lane_offsets<V512>(fq, g, fq.ldq, off);
    const __mmask16 live = __mmask16(flash_rows::live_lanes<V512>(fq, g));
    uint16_t* qb = qb_of(fq, st, g);
    for (int j = 0; j < hd / 2; ++j)
      _mm512_storeu_si512(qb + 32 * j, interleave(_mm512_maskz_mul_ps(live, V512::gather(fq.q + 2 * j, off), c),
                                                  _mm512_maskz_mul_ps(live, V512::gather(fq.q + 2 * j + 1, off), c)));
  }
  const size_t n = size_t(lo.G) * hd * 16;
  for (size_t e = 0; e < n; e += 16) V512::store(lo.ot + e, V512::zero());
  for (int e = 0; e < lo.G * 16; e += 16) {
    V512::store(lo.m + e, V512::set1(-__builtin_inff()));
    V512::store(lo.l + e, V512::zero());
  }
}

// The largest finite bf16 (larger floats round to inf).
constexpr float kBf16Max = 3.38953139e38f;

// Tile j's keys (row-major) and values (transposed) as bf16. Values are
// clamped to finite bf16 (NaN to the largest): a key one row does not see
// enters its products as p = 0 times the value, and 0 * inf would turn
// that row's output into NaN where the fp32 kernels leave it untouched
// (masked), and where a lone token never loads the key at all.
void stage_tile(int hd, const float* k, const float* v, uint16_t* kb, uint16_t* vt) {
  for (int t = 0; t < kTile; ++t)
    for (int d = 0; d < hd; d += 32) {
      const R a = V512::load(k + size_t(t) * hd + d);
      if (d + 16 < hd)
        _mm512_storeu_si512(kb + size_t(t) * hd + d,
                            (__m512i)_mm512_cvtne2ps_pbh(V512::load(k + size_t(t) * hd + d + 16), a));
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(kb + size_t(t) * hd + d), (__m256i)_mm512_cvtneps_pbh(a));
    }
  for (int d0 = 0; d0 < hd; d0 += 16) {
    R r[16];
#pragma GCC unroll 16
    for (int t = 0; t < kTile; ++t)
      r[t] = _mm512_max_ps(_mm512_min_ps(V512::load(v + size_t(t) * hd + d0), V512::set1(kBf16Max)),
                           V512::set1(-kBf16Max));
    transpose16(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(vt + size_t(d0 + i) * 16), (__m256i)_mm512_cvtneps_pbh(r[i]));
  }
}

// One 16-d slice c of the scores of tiles j0 .. j0 + cnt - 1 into C tiles
// 4 .. 3 + cnt: the queries' slice (B tile B) is loaded once, and the
// products of different tiles alternate, so no product waits for the one
// before it.
template <int B>
void score_slice(const uint16_t* kb, size_t kv, int64_t ks, const uint16_t* qbc, int cnt) {
  tload<B>(qbc, 64);
  tload<0>(kb, ks);
  dp<4, 0, B>();
  if (cnt > 1) {
    tload<1>(kb + kv, ks);
    dp<5, 1, B>();
  }
  if (cnt > 2) {
    tload<0>(kb + 2 * kv, ks);
    dp<6, 0, B>();
  }
  if (cnt > 3) {
    tload<1>(kb + 3 * kv, ks);
    dp<7, 1, B>();
  }
}

// S^T of cnt tiles (keys kb, kv bf16 apart) into C tiles 4 .. 3 + cnt,
// 16 d per product in order of d.
void score_products(const uint16_t* kb, size_t kv, const uint16_t* qb, int hd, int cnt) {
  const int64_t ks = int64_t(hd) * 2;
  tzero<4>();
  if (cnt > 1) tzero<5>();
  if (cnt > 2) tzero<6>();
  if (cnt > 3) tzero<7>();
  for (int c = 0; c < hd / 16; ++c) {
    if (c & 1) score_slice<3>(kb + 16 * c, kv, ks, qb + 256 * c, cnt);
    else score_slice<2>(kb + 16 * c, kv, ks, qb + 256 * c, cnt);
  }
}

// Pass 1 for row group g over tiles [0, n): each tile's alpha, P^T and
// flags; m and l updated.
void scores_pass(const FlashQuery& fq, float* st, const Work& w, int g, int n, const uint16_t* const* vis) {
  const flash_rows::Layout lo = flash_rows::layout<V512>(fq, st);
  float* m = lo.m + size_t(g) * 16;
  float* l = lo.l + size_t(g) * 16;
  const uint16_t* qb = qb_of(fq, st, g);
  const size_t kv = size_t(fq.hd) * 16;  // bf16 per tile's keys (and values)
  for (int j0 = 0; j0 < n; j0 += 4) {
    const int cnt = n - j0 < 4 ? n - j0 : 4;
    __mmask16 km[4][kTile];
    unsigned lanes[kTile];
    for (int i = 0; i < cnt; ++i) {
      const int j = j0 + i;
      w.state[j] = vis[j] && flash_rows::lane_masks<V512>(fq, g, vis[j], km[i], lanes) == 0 ? kSkip : 0;
    }
    // Products first (up to four in flight; skipped tiles' go unread), then their stores.
    score_products(w.kb + size_t(j0) * kv, kv, qb, fq.hd, cnt);
    tstore<4>(w.sb);
    if (cnt > 1) tstore<5>(w.sb + 256);
    if (cnt > 2) tstore<6>(w.sb + 512);
    if (cnt > 3) tstore<7>(w.sb + 768);
    for (int i = 0; i < cnt; ++i) {
      const int j = j0 + i;
      if (w.state[j] & kSkip) continue;  // no lane sees the tile: left as it is
      R s[kTile], p[kTile];
#pragma GCC unroll 16
      for (int t = 0; t < kTile; ++t) s[t] = V512::load(w.sb + 256 * i + 16 * t);
      if (fq.softcap > 0.0f) flash_rows::cap_scores<V512>(fq, s);
      const R alpha = vis[j] ? flash_rows::softmax<V512, true>(s, km[i], m, l, p)
                             : flash_rows::softmax<V512, false>(s, nullptr, m, l, p);
      V512::store(w.alpha + 16 * j, alpha);
      if (!V512::all_equal(alpha, 1.0f)) w.state[j] |= kRescale;
      uint16_t* pb = w.pb + size_t(j) * 256;
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) _mm512_storeu_si512(pb + 32 * q, interleave(p[2 * q], p[2 * q + 1]));
    }
  }
}

// O^T's slices d0 .. d0 + 16 ns - 1 ([16 d, 16 lanes] each) between memory
// and C tiles 4 .. 3 + ns.
void slices_in(const float* o, int ns) {
  tload<4>(o, 64);
  if (ns > 1) tload<5>(o + 256, 64);
  if (ns > 2) tload<6>(o + 512, 64);
  if (ns > 3) tload<7>(o + 768, 64);
}
void slices_out(float* o, int ns) {
  tstore<4>(o);
  if (ns > 1) tstore<5>(o + 256);
  if (ns > 2) tstore<6>(o + 512);
  if (ns > 3) tstore<7>(o + 768);
}

// O^T slice (C tile 4 + s) += values^T slice s . P^T (B tile B).
template <int B>
void value_products(const uint16_t* vt, int ns) {
  tload<0>(vt, 32);
  dp<4, 0, B>();
  if (ns > 1) {
    tload<1>(vt + 256, 32);
    dp<5, 1, B>();
  }
  if (ns > 2) {
    tload<0>(vt + 512, 32);
    dp<6, 0, B>();
  }
  if (ns > 3) {
    tload<1>(vt + 768, 32);
    dp<7, 1, B>();
  }
}

// Pass 2 for row group g: its outputs, 64 d at a time, over tiles [0, n).
void values_pass(const FlashQuery& fq, float* st, const Work& w, int g, int n) {
  const flash_rows::Layout lo = flash_rows::layout<V512>(fq, st);
  float* ot = lo.ot + size_t(g) * fq.hd * 16;  // [hd, 16]
  const size_t kv = size_t(fq.hd) * 16;
  for (int d0 = 0; d0 < fq.hd; d0 += 64) {
    const int ns = fq.hd - d0 >= 64 ? 4 : (fq.hd - d0) / 16;
    float* o = ot + size_t(d0) * 16;
    slices_in(o, ns);
    for (int j = 0; j < n; ++j) {
      if (w.state[j] & kSkip) continue;
      if (w.state[j] & kRescale) {  // o * alpha, exactly as the fp32 kernels scale
        slices_out(o, ns);
        const R a = V512::load(w.alpha + 16 * j);
        for (int i = 0; i < 16 * ns; ++i) V512::store(o + 16 * i, V512::mul(V512::load(o + 16 * i), a));
        slices_in(o, ns);
      }
      const uint16_t* vt = w.vt + size_t(j) * kv + size_t(d0) * 16;
      if (j & 1) {
        tload<3>(w.pb + size_t(j) * 256, 64);
        value_products<3>(vt, ns);
      } else {
        tload<2>(w.pb + size_t(j) * 256, 64);
        value_products<2>(vt, ns);
      }
    }
    slices_out(o, ns);
  }
}

void tiles_bf16(const FlashQuery& fq, float* st, int n, const float* k, const float* v,
                const uint16_t* const* vis) {
  const flash_rows::Layout lo = flash_rows::layout<V512>(fq, st);
  const Work w = work(fq, st);
  const size_t f = size_t(kTile) * fq.hd;  // floats per tile of k or v (and bf16 of kb or vt)
  for (int j = 0; j < n; ++j) stage_tile(fq.hd, k + j * f, v + j * f, w.kb + j * f, w.vt + j * f);
  const Tiles tiles;
  for (int g = 0; g < lo.G; ++g) {
    scores_pass(fq, st, w, g, n, vis);
    values_pass(fq, st, w, g, n);
  }
}

void tile_bf16(const FlashQuery& fq, float* st, const float* k, const float* v, const uint16_t* vis) {
  tiles_bf16(fq, st, 1, k, v, &vis);
}

void finish_bf16(const FlashQuery& fq, const float* st, float* out, size_t ldo) {
  flash_rows::finish<V512, false>(fq, st, out, ldo);
}

}  // namespace
KVS_TARGET_END()

const FlashKernel& flash_kernel_amx_bf16() {
  static const FlashKernel k{begin_bf16, tile_bf16, finish_bf16, tiles_bf16};
  return k;
}

}  // namespace kvs::attn
