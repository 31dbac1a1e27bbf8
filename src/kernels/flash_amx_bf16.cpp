// AMX-BF16 instance of the tiled attention (flash_attention.h's bf16
// variant): both products of a key tile run on bf16 tiles, the online
// softmax is flash_rows_impl.h's, in fp32 with lanes = rows, and the rows'
// m, l and outputs keep that kernel's lane layout (its finish() is reused).
//
// Per call (one key tile, every row group of the query block):
//   keys    kb [16, hd32] bf16, row-major (an A tile per 32 d)
//   values  vt [hd16, 16] bf16, transposed (an A tile per 16 d)
// Per row group of 16 rows (lanes):
//   queries qb [hd32 / 2, 16, 2] bf16: d pairs x rows (B tiles, from begin)
//   S^T  = kb . qb           [16 keys, 16 rows] f32: row k is s_k over lanes
//   P^T  = p pairs x rows    [8, 16, 2] bf16 (B tile)
//   O^T += vt . P^T          [16 d, 16 rows] f32 per 16 d, added into the
//                            rows' outputs with their alpha
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

// Tiles (the numbers are literals in the asm):
//   0 C  S^T [16, 64 B]        1 A  keys, 32 d [16, 64 B]   2 B  queries, 32 d [16, 64 B]
//   3 A  values^T, 16 d [16, 32 B]   4 B  P^T [8, 64 B]    5, 6 C  products, 16 d [16, 64 B]
// (0 and 2 hold products too once the scores are stored.)
#define KVS_FA_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(int64_t(stride)) : "memory")
#define KVS_FA_STORE(t, base) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(int64_t(64)) : "memory")

// Loads the configuration for one call; releases the tiles when it ends,
// so no tile state outlives the call on a pool thread.
struct Tiles {
  Tiles() {
    TileConfig c;
    for (int t = 0; t < 7; ++t) c.rows[t] = 16, c.colsb[t] = 64;
    c.colsb[3] = 32;
    c.rows[4] = 8;
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
  }
  ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

int pad32(int hd) { return (hd + 31) / 32 * 32; }

// The call's tiles after the rows' state (flash_work_floats).
struct Work {
  uint16_t* kb;  // [16, hd32]
  uint16_t* vt;  // [hd16, 16]
  float* sb;     // [16, 16]
  uint16_t* pb;  // [8, 32]
  float* pv;     // [4, 16, 16]
};

Work work(const FlashQuery& fq, float* st) {
  const size_t lanes = size_t(fq.rows() + 15) / 16 * 16, hd32 = size_t(pad32(fq.hd));
  float* w = st + 2 * lanes * size_t(fq.hd) + 2 * lanes;
  float* vt = w + 8 * hd32;
  float* sb = vt + 8 * size_t(fq.hd);
  return {reinterpret_cast<uint16_t*>(w), reinterpret_cast<uint16_t*>(vt), sb,
          reinterpret_cast<uint16_t*>(sb + 256), sb + 384};
}

// Row group g's bf16 queries (in the fp32 kernel's qt region, which is
// larger): pair j of d is 64 bytes, lane-interleaved.
uint16_t* qb_of(const FlashQuery& fq, float* st, int g) {
  return reinterpret_cast<uint16_t*>(st) + size_t(g) * size_t(pad32(fq.hd)) * 16;
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
  const int hd = fq.hd, hd32 = pad32(hd);
  const R c = V512::set1(fq.query_factor());
  for (int g = 0; g < lo.G; ++g) {
    int off[16];
    flash_rows::lane_offsets<V512>(fq, g, fq.ldq, off);
    const __mmask16 live = __mmask16(flash_rows::live_lanes<V512>(fq, g));
    uint16_t* qb = qb_of(fq, st, g);
    for (int j = 0; j < hd32 / 2; ++j) {
      R q2[2];
      for (int e = 0; e < 2; ++e) {
        const int d = 2 * j + e;
        q2[e] = d < hd ? _mm512_maskz_mul_ps(live, V512::gather(fq.q + d, off), c) : V512::zero();
      }
      _mm512_storeu_si512(qb + 32 * j, interleave(q2[0], q2[1]));
    }
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

// The call's keys (row-major, zero past hd) and values (transposed) as bf16.
// Values are clamped to finite bf16 (NaN to the largest): a key one row
// does not see enters its products as p = 0 times the value, and 0 * inf
// would turn that row's output into NaN where the fp32 kernels leave it
// untouched (masked), and where a lone token never loads the key at all.
void stage_tile(const FlashQuery& fq, const Work& w, const float* k, const float* v) {
  const int hd = fq.hd, hd32 = pad32(hd);
  for (int t = 0; t < kTile; ++t)
    for (int d = 0; d < hd32; d += 32) {
      const R a = V512::load(k + size_t(t) * hd + d);
      const R b = d + 16 < hd ? V512::load(k + size_t(t) * hd + d + 16) : V512::zero();
      _mm512_storeu_si512(w.kb + size_t(t) * hd32 + d, (__m512i)_mm512_cvtne2ps_pbh(b, a));
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
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.vt + size_t(d0 + i) * 16), (__m256i)_mm512_cvtneps_pbh(r[i]));
  }
}

// s [16]: row group g's scores, lanes = rows.
void scores(const FlashQuery& fq, float* st, const Work& w, int g, R* s) {
  const int hd32 = pad32(fq.hd);
  const uint16_t* qb = qb_of(fq, st, g);
  _tile_zero(0);
  for (int d = 0; d < hd32; d += 32) {
    KVS_FA_LOAD(1, w.kb + d, hd32 * 2);
    KVS_FA_LOAD(2, qb + size_t(d) * 16, 64);
    _tile_dpbf16ps(0, 1, 2);
  }
  KVS_FA_STORE(0, w.sb);
#pragma GCC unroll 16
  for (int t = 0; t < kTile; ++t) s[t] = V512::load(w.sb + 16 * t);
}

// One 16-d slice of the value product into C tile C: its A tile (3) is
// loaded, so C's product can run while the slices before it are stored.
#define KVS_FA_PV(C, vt_rows)            \
  KVS_FA_LOAD(3, (vt_rows), 32);         \
  _tile_zero(C);                         \
  _tile_dpbf16ps(C, 3, 4)

// oT = fma(oT, alpha, vt . P^T), 16 d at a time, up to four slices in
// flight (C tiles 5, 6, 0, 2: the scores' tiles are free by now). A row
// that sees no key of the tile keeps its o: alpha = 1, and its products
// sum to +0 from a zeroed tile (values are finite), and o is never -0 (it
// starts at +0 and only ever adds such sums).
void accumulate(const FlashQuery& fq, const Work& w, float* ot, const R* p, R alpha) {
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) _mm512_storeu_si512(w.pb + 32 * j, interleave(p[2 * j], p[2 * j + 1]));
  KVS_FA_LOAD(4, w.pb, 64);
  for (int d0 = 0; d0 < fq.hd; d0 += 64) {
    const int n = fq.hd - d0 >= 64 ? 4 : (fq.hd - d0) / 16;
    const uint16_t* vt = w.vt + size_t(d0) * 16;
    KVS_FA_PV(5, vt);
    if (n > 1) { KVS_FA_PV(6, vt + 256); }
    if (n > 2) { KVS_FA_PV(0, vt + 512); }
    if (n > 3) { KVS_FA_PV(2, vt + 768); }
    KVS_FA_STORE(5, w.pv);
    if (n > 1) KVS_FA_STORE(6, w.pv + 256);
    if (n > 2) KVS_FA_STORE(0, w.pv + 512);
    if (n > 3) KVS_FA_STORE(2, w.pv + 768);
    float* o = ot + size_t(d0) * 16;  // [16 d, 16 lanes] per slice
    for (int i = 0; i < 16 * n; ++i)
      V512::store(o + 16 * i, V512::fma(V512::load(o + 16 * i), alpha, V512::load(w.pv + 16 * i)));
  }
}

void tile_bf16(const FlashQuery& fq, float* st, const float* k, const float* v, const uint16_t* vis) {
  const flash_rows::Layout lo = flash_rows::layout<V512>(fq, st);
  const Work w = work(fq, st);
  const Tiles tiles;
  stage_tile(fq, w, k, v);
  for (int g = 0; g < lo.G; ++g) {
    float* m = lo.m + size_t(g) * 16;
    float* l = lo.l + size_t(g) * 16;
    float* ot = lo.ot + size_t(g) * fq.hd * 16;
    R s[kTile], p[kTile];
    if (!vis) {
      scores(fq, st, w, g, s);
      if (fq.softcap > 0.0f) flash_rows::cap_scores<V512>(fq, s);
      const R alpha = flash_rows::softmax<V512, false>(s, nullptr, m, l, p);
      accumulate(fq, w, ot, p, alpha);
      continue;
    }
    __mmask16 km[kTile];
    unsigned lanes[kTile];
    if (flash_rows::lane_masks<V512>(fq, g, vis, km, lanes) == 0) continue;  // no lane sees the tile
    scores(fq, st, w, g, s);
    if (fq.softcap > 0.0f) flash_rows::cap_scores<V512>(fq, s);
    const R alpha = flash_rows::softmax<V512, true>(s, km, m, l, p);
    accumulate(fq, w, ot, p, alpha);
  }
}

void finish_bf16(const FlashQuery& fq, const float* st, float* out, size_t ldo) {
  flash_rows::finish<V512, false>(fq, st, out, ldo);
}

}  // namespace
KVS_TARGET_END()

const FlashKernel& flash_kernel_amx_bf16() {
  static const FlashKernel k{begin_bf16, tile_bf16, finish_bf16};
  return k;
}

}  // namespace kvs::attn
