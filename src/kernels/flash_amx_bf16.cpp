// AMX-BF16 instance of the tiled attention (flash_attention.h's bf16
// variant): both products of a key tile run on bf16 tiles, the online
// softmax is flash_rows_impl.h's, in fp32 with lanes = rows, and the rows'
// m, l and outputs keep that kernel's lane layout (its finish() is reused).
// Its maximum is the lazy one (kLazyMaxLog2): the outputs, held in tile
// registers across a call, go through memory to be rescaled only when a
// row's reference moves, which after the first tiles is rare.
//
// A call takes up to kTileBatch key tiles (tiles(); tile() is one):
//   keys    kb [16, hd32] bf16 per tile, row-major (hd32: hd rounded up
//           to 32, zeros past hd)
//   values  vt [hd, 16] bf16 per tile, transposed
// and runs each row group of 16 rows (lanes) over all of them in two passes:
//   1. scores and softmax, four tiles at a time, the next four tiles'
//      products running while this four's softmax does:
//        S^T = kb . qb  [16 keys, 16 rows] f32, qb the group's queries
//        [hd32 / 2, 16, 2] bf16 (d pairs x rows, written by begin); row k
//        of S^T is s_k over the lanes; then per tile its alpha and
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

// Tiles (a product costs the same whatever its K, so scores take 32 d per
// product; values take a tile's 16 keys):
//   0  A [16, 64 B]  32 d of a tile's keys       2  B [16, 64 B]  32 d of the queries
//   1  A [16, 32 B]  16 d of a tile's values^T   3  B [8, 64 B]   a tile's P^T
//   4..7  C [16, 64 B]  four tiles' S^T (pass 1), four 16-d slices of O^T (pass 2)
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
    c.colsb[1] = 32;
    c.rows[3] = 8;
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
  }
  ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

// The call's work after the rows' state (flash_work_floats).
struct Work {
  float* sb;       // [2, 4, 16, 16] scores of four tiles, two rounds
  uint16_t* kb;    // [n, 16, hd32]
  uint16_t* vt;    // [n, hd, 16]
  uint16_t* pb;    // [n, 8, 32]
  float* alpha;    // [n, 16]
  uint8_t* state;  // [n] kSkip / kRescale
};
constexpr uint8_t kSkip = 1, kRescale = 2;

int pad32(int hd) { return (hd + 31) / 32 * 32; }

Work work(const FlashQuery& fq, float* st) {
  const size_t lanes = size_t(fq.rows() + 15) / 16 * 16, hd = size_t(fq.hd), nb = kTileBatch;
  float* sb = st + 2 * lanes * hd + 2 * lanes;
  float* kb = sb + 2048;
  float* vt = kb + nb * 8 * size_t(pad32(fq.hd));
  float* pb = vt + nb * 8 * hd;
  float* alpha = pb + nb * 128;
  return {sb, reinterpret_cast<uint16_t*>(kb), reinterpret_cast<uint16_t*>(vt), reinterpret_cast<uint16_t*>(pb),
          alpha, reinterpret_cast<uint8_t*>(alpha + nb * 16)};
}

// Row group g's bf16 queries (in the fp32 kernel's qt region, which is
// large enough): pair j of d is 64 bytes, lane-interleaved, zeros past hd.
uint16_t* qb_of(const FlashQuery& fq, float* st, int g) {
  return reinterpret_cast<uint16_t*>(st) + size_t(g) * size_t(pad32(fq.hd)) * 16;
}

// bf16 of a and b interleaved by lane: a0 b0 a1 b1 ... (a B tile row).
__m512i interleave(R a, R b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
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
    for (int d = 0; d < hd; d += 16) {
      R x[16];
      flash_rows::rows_to_lanes<V512>(fq.q, off, d, x);
#pragma GCC unroll 8
      for (int i = 0; i < 16; i += 2)
        _mm512_storeu_si512(qb + 16 * (d + i), interleave(_mm512_maskz_mul_ps(live, x[i], c),
                                                          _mm512_maskz_mul_ps(live, x[i + 1], c)));
    }
    if (hd % 32)
      for (int i = 0; i < 8; ++i) _mm512_storeu_si512(qb + 16 * (hd + 2 * i), _mm512_setzero_si512());
  }
  flash_rows::clear_state<V512>(lo, hd);
}

// The largest finite bf16 (larger floats round to inf).
constexpr float kBf16Max = 3.38953139e38f;

// Tile j's keys (row-major) and values (transposed) as bf16. Values are
// clamped to finite bf16 (NaN to the largest): a key one row does not see
// enters its products as p = 0 times the value, and 0 * inf would turn
// that row's output into NaN where the fp32 kernels leave it untouched
// (masked), and where a lone token never loads the key at all.
void stage_tile(int hd, const float* k, const float* v, uint16_t* kb, uint16_t* vt) {
  const int hd32 = pad32(hd);
  for (int t = 0; t < kTile; ++t)
    for (int d = 0; d < hd; d += 32) {
      const R a = V512::load(k + size_t(t) * hd + d);
      const R b = d + 16 < hd ? V512::load(k + size_t(t) * hd + d + 16) : V512::zero();
      _mm512_storeu_si512(kb + size_t(t) * hd32 + d, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  for (int d0 = 0; d0 < hd; d0 += 16) {
    R r[16];
#pragma GCC unroll 16
    for (int t = 0; t < kTile; ++t)
      r[t] = _mm512_max_ps(_mm512_min_ps(V512::load(v + size_t(t) * hd + d0), V512::set1(kBf16Max)),
                           V512::set1(-kBf16Max));
    V512::transpose(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(vt + size_t(d0 + i) * 16), (__m256i)_mm512_cvtneps_pbh(r[i]));
  }
}

// S^T of cnt tiles (keys kb, kv bf16 apart) into C tiles 4 .. 3 + cnt,
// 32 d per product in order of d; the queries' slice is loaded once per
// 32 d for all of them.
void score_products(const uint16_t* kb, size_t kv, const uint16_t* qb, int hd32, int cnt) {
  const int64_t ks = int64_t(hd32) * 2;
  tzero<4>();
  if (cnt > 1) tzero<5>();
  if (cnt > 2) tzero<6>();
  if (cnt > 3) tzero<7>();
  for (int d = 0; d < hd32; d += 32) {
    tload<2>(qb + 16 * d, 64);
    tload<0>(kb + d, ks);
    dp<4, 0, 2>();
    if (cnt > 1) {
      tload<0>(kb + kv + d, ks);
      dp<5, 0, 2>();
    }
    if (cnt > 2) {
      tload<0>(kb + 2 * kv + d, ks);
      dp<6, 0, 2>();
    }
    if (cnt > 3) {
      tload<0>(kb + 3 * kv + d, ks);
      dp<7, 0, 2>();
    }
  }
}

void store_scores(float* sb, int cnt) {
  tstore<4>(sb);
  if (cnt > 1) tstore<5>(sb + 256);
  if (cnt > 2) tstore<6>(sb + 512);
  if (cnt > 3) tstore<7>(sb + 768);
}

// Pass 1 for row group g over tiles [0, n): each tile's alpha, P^T and
// flags; m and l updated.
void scores_pass(const FlashQuery& fq, float* st, const Work& w, int g, int n, const uint16_t* const* vis) {
  const flash_rows::Layout lo = flash_rows::layout<V512>(fq, st);
  float* m = lo.m + size_t(g) * 16;
  float* l = lo.l + size_t(g) * 16;
  const uint16_t* qb = qb_of(fq, st, g);
  const int hd32 = pad32(fq.hd);
  const size_t kv = size_t(hd32) * 16;  // bf16 per tile's keys
  __mmask16 km[kTileBatch][kTile];
  unsigned lanes[kTile];
  for (int j = 0; j < n; ++j)
    w.state[j] = vis[j] && flash_rows::lane_masks<V512>(fq, g, vis[j], km[j], lanes) == 0 ? kSkip : 0;
  // Skipped tiles' products run too, unread.
  score_products(w.kb, kv, qb, hd32, n < 4 ? n : 4);
  for (int j0 = 0; j0 < n; j0 += 4) {
    const int cnt = n - j0 < 4 ? n - j0 : 4;
    float* sb = w.sb + (j0 / 4 % 2) * 1024;
    store_scores(sb, cnt);
    if (j0 + 4 < n) score_products(w.kb + size_t(j0 + 4) * kv, kv, qb, hd32, n - j0 - 4 < 4 ? n - j0 - 4 : 4);
    for (int i = 0; i < cnt; ++i) {
      const int j = j0 + i;
      if (w.state[j] & kSkip) continue;  // no lane sees the tile: left as it is
      R s[kTile], p[kTile];
#pragma GCC unroll 16
      for (int t = 0; t < kTile; ++t) s[t] = V512::load(sb + 256 * i + 16 * t);
      if (fq.softcap > 0.0f) flash_rows::cap_scores<V512>(fq, s);
      const R alpha = vis[j] ? flash_rows::softmax<V512, true, true>(s, km[j], m, l, p)
                             : flash_rows::softmax<V512, false, true>(s, nullptr, m, l, p);
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

// O^T slice (C tile 4 + s) += values^T slice s . P^T (B tile 3).
void value_products(const uint16_t* vt, int ns) {
  tload<1>(vt, 32);
  dp<4, 1, 3>();
  if (ns > 1) {
    tload<1>(vt + 256, 32);
    dp<5, 1, 3>();
  }
  if (ns > 2) {
    tload<1>(vt + 512, 32);
    dp<6, 1, 3>();
  }
  if (ns > 3) {
    tload<1>(vt + 768, 32);
    dp<7, 1, 3>();
  }
}

// Pass 2 for row group g: its outputs, 64 d at a time, over tiles [0, n).
void values_pass(const FlashQuery& fq, float* st, const Work& w, int g, int n) {
  const flash_rows::Layout lo = flash_rows::layout<V512>(fq, st);
  float* ot = lo.ot + size_t(g) * fq.hd * 16;  // [hd, 16]
  const size_t kv = size_t(fq.hd) * 16;  // bf16 per tile's values
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
      tload<3>(w.pb + size_t(j) * 256, 64);
      value_products(w.vt + size_t(j) * kv + size_t(d0) * 16, ns);
    }
    slices_out(o, ns);
  }
}

void tiles_bf16(const FlashQuery& fq, float* st, int n, const float* k, const float* v,
                const uint16_t* const* vis) {
  const flash_rows::Layout lo = flash_rows::layout<V512>(fq, st);
  const Work w = work(fq, st);
  const size_t f = size_t(kTile) * fq.hd, f32 = size_t(kTile) * pad32(fq.hd);  // per tile: k, v, vt; kb
  for (int j = 0; j < n; ++j) stage_tile(fq.hd, k + j * f, v + j * f, w.kb + j * f32, w.vt + j * f);
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
