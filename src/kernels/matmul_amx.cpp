// AMX-INT8 tile kernels for Panel16 Q8_0 / Q4_0 / Q4_K / Q6_K weights, run
// from n >= amx_min_rows(type) activation rows (kernels/amx_rows.h); smaller
// n, the file layout and every other format run the AVX-512 VNNI kernels.
//
// One tile product per 32-element block b gives the exact integer block dots
// of 16 activation rows x the 16 weight rows of a panel:
//   A [16, 32] s8  activation levels of rows 16t .. 16t+15 (XTile::q, laid
//                  out by the driver once per call: one contiguous tile)
//   B [8, 64] s8   weight levels in the tile's dword-group order, which is
//                  the Panel16 vector order: row k, dword r = elements
//                  4k..4k+3 of weight row r. A K slice of the panel is
//                  copied into scratch as signed levels q (not q + off), so
//                  the XBlock correction is not needed: sum(q_w * q_x) is the
//                  integer corr + sum(u * q_x) that block_step() computes.
//   C [16, 16] s32 tdpbssd(A, B): C[m][r] = isum of activation row 16t + m
//                  and weight row r
// C goes through a 1 KiB buffer into zmm registers, lane r = weight row r as
// in block_step(), and the float chain of matmul_internal.h runs per row m:
//   acc[m] = fma(float(C[m]), ws * xd_m, acc[m])   (+ fma(wm, xs_m, acc[m]))
// so the results are bit-identical to the VNNI kernels. Q6_K needs one isum
// per 16-element half: two K = 16 products per block (lo, then hi).
//
// The tile configuration is loaded at the start of each call and released at
// its end, so no tile state outlives a kernel on a pool thread (a live state
// costs every context switch an 8 KiB save).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/matmul_avx512_unpack.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2,popcnt,amx-tile,amx-int8")

namespace {

using namespace avx512_detail;
constexpr int KB = 32;               // blocks per K slice of one panel in scratch
constexpr int64_t kBlockBytes = 704;  // scratch block: B levels [512], ws0, ws1, wm [16 floats each]

// Palette-1 tile configuration (the layout LDTILECFG reads).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads the configuration; releases the tiles when the call ends. Two tile
// sets alternate block by block: K32 types C0 A4 B6 / C1 A5 B7; Q6_K C0 C1
// / C2 C3 (lo, hi accumulators) with A4 A5 (lo, hi halves, K = 16) and
// B6 B7 shared.
class TileScope {
 public:
  explicit TileScope(bool sub16) {
    TileConfig c;
    for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
    c.colsb[4] = c.colsb[5] = sub16 ? 16 : 32;
    c.rows[6] = c.rows[7] = sub16 ? 4 : 8;
    // GCC 12's _tile_loadconfig names only 8 bytes as read, so the other
    // stores to c could be dropped: the whole struct is the operand here.
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// Tile loads and stores with the exact bytes they touch as memory operands
// (GCC 12's intrinsics name none, or clobber all memory, which keeps the
// accumulator array out of registers). The tile number is a literal.
#define KVS_TILE_LOAD(t, base, stride, bytes)                                               \
  __asm__ volatile("tileloadd (%1,%2,1), %%tmm" #t ::"m"(*(const uint8_t(*)[bytes])(base)), \
                   "r"(base), "r"(int64_t(stride)))
#define KVS_TILE_STORE(t, base)                                                                          \
  __asm__ volatile("tilestored %%tmm" #t ", (%1,%2,1)" : "=m"(*(int32_t(*)[256])(base)) : "r"(base), \
                   "r"(int64_t(64)))

// int32 per block in the C buffer.
template <bool SUB16>
constexpr int64_t kCInts = SUB16 ? 512 : 256;

// One block's product on a tile set (literal tile numbers): a is its
// activation tile, b its scratch block.
#define KVS_PRODUCT_K32(C, A, B, a, b)    \
  KVS_TILE_LOAD(A, (a)->q, 32, 512);      \
  KVS_TILE_LOAD(B, (b), 64, 512);         \
  _tile_zero(C);                          \
  _tile_dpbssd(C, A, B)
#define KVS_PRODUCT_SUB16(CL, CH, a, b)                                            \
  KVS_TILE_LOAD(4, (a)->q, 32, 512);                                               \
  KVS_TILE_LOAD(5, &(a)->q[0][16], 32, 496); /* bytes 16..31 of each row */     \
  KVS_TILE_LOAD(6, (b), 64, 256);                                                  \
  KVS_TILE_LOAD(7, (b) + 256, 64, 256);                                            \
  _tile_zero(CL);                                                                  \
  _tile_zero(CH);                                                                  \
  _tile_dpbssd(CL, 4, 6);                                                          \
  _tile_dpbssd(CH, 5, 7)

// Integer products of cnt (1 or 2) consecutive blocks into out ([cnt][16,
// 16] int32; Q6_K [cnt][2][16, 16], lo then hi): one block on tile set
// `set`, two on both sets, both products issued before the stores (a store
// waits for its product; the float chain that follows reads a buffer
// stored the round before).
template <bool SUB16>
inline void products(int set, const XTile* a, const uint8_t* b, int cnt, int32_t* out) {
  if (!SUB16) {
    if (cnt == 2) {
      KVS_PRODUCT_K32(0, 4, 6, a, b);
      KVS_PRODUCT_K32(1, 5, 7, a + 1, b + kBlockBytes);
      KVS_TILE_STORE(0, out);
      KVS_TILE_STORE(1, out + 256);
    } else if (set == 0) {
      KVS_PRODUCT_K32(0, 4, 6, a, b);
      KVS_TILE_STORE(0, out);
    } else {
      KVS_PRODUCT_K32(1, 5, 7, a, b);
      KVS_TILE_STORE(1, out);
    }
  } else if (cnt == 2) {
    KVS_PRODUCT_SUB16(0, 1, a, b);
    KVS_PRODUCT_SUB16(2, 3, a + 1, b + kBlockBytes);
    KVS_TILE_STORE(0, out);
    KVS_TILE_STORE(1, out + 256);
    KVS_TILE_STORE(2, out + 512);
    KVS_TILE_STORE(3, out + 768);
  } else if (set == 0) {
    KVS_PRODUCT_SUB16(0, 1, a, b);
    KVS_TILE_STORE(0, out);
    KVS_TILE_STORE(1, out + 256);
  } else {
    KVS_PRODUCT_SUB16(2, 3, a, b);
    KVS_TILE_STORE(2, out);
    KVS_TILE_STORE(3, out + 256);
  }
}
#undef KVS_PRODUCT_K32
#undef KVS_PRODUCT_SUB16

// The float chain step of one block for rows m < rows (all 16 when FULL):
// exactly block_step()'s operations on the tile's integer sums.
template <bool SUB16, bool MIN, bool FULL>
inline void chain(const int32_t* cbuf, const uint8_t* s, const XTile& x, int rows, __m512* acc) {
  const __m512 ws0 = _mm512_load_ps(reinterpret_cast<const float*>(s + 512));
  const __m512 ws1 = SUB16 ? _mm512_load_ps(reinterpret_cast<const float*>(s + 576)) : ws0;
  const __m512 wm = MIN ? _mm512_load_ps(reinterpret_cast<const float*>(s + 640)) : ws0;
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    const __m512 xd = _mm512_set1_ps(x.d[m]);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 16 * m));
    acc[m] = _mm512_fmadd_ps(lo, _mm512_mul_ps(ws0, xd), acc[m]);
    if (SUB16) {
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 256 + 16 * m));
      acc[m] = _mm512_fmadd_ps(hi, _mm512_mul_ps(ws1, xd), acc[m]);
    }
    if (MIN) acc[m] = _mm512_fmadd_ps(wm, _mm512_set1_ps(x.s[m]), acc[m]);
  }
}

// One M tile (activation rows of xt, `rows` of them real; y at its first
// row) against the scratch slice of blocks [kb0, kb0 + kb) of one panel.
// The accumulators live in y between slices (exact round trip), as in the
// VNNI tiles. Products run a group of G (1 or 2) blocks ahead of the
// float chain: two paid where several M tiles share a slice, one where a
// single M tile runs right after the slice's copy (both measured,
// docs/PERFORMANCE.md).
// The next weight slice, requested a few lines per block: all of it at once
// stalled on the fill buffers.
struct Ahead {
  const uint8_t* p;  // first line
  int64_t lines;
  int64_t per = 0;   // lines per block (set by spread)
  void spread(int64_t kb) { per = (lines + kb - 1) / kb; }
  void at(int64_t bb) const {
    for (int64_t l = bb * per; l < std::min(lines, (bb + 1) * per); ++l)
      _mm_prefetch(reinterpret_cast<const char*>(p + 64 * l), _MM_HINT_T1);
  }
};

template <bool SUB16, bool MIN, bool FULL, int G>
void tile_rows(const uint8_t* slice, int64_t kb0, int64_t kb, const XTile* xt, int rows, float* y, int64_t ldy,
               __mmask16 valid, int32_t* cbuf, Ahead ahead) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    acc[m] = kb0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid, y + m * ldy);
  }
  const XTile* x = xt + kb0;
  constexpr int64_t kC = kCInts<SUB16>;
  int32_t* const ring0 = cbuf;           // even groups' integers
  int32_t* const ring1 = cbuf + 2 * kC;  // odd groups'
  products<SUB16>(0, x, slice, int(std::min<int64_t>(G, kb)), ring0);
  for (int64_t g = 0; g < kb; g += G) {  // no inner loop: the accumulators stay in registers
    const bool odd = (g / G) & 1;
    int32_t* const cur = odd ? ring1 : ring0;
    if (g + G < kb)
      products<SUB16>(!odd, x + g + G, slice + (g + G) * kBlockBytes, int(std::min<int64_t>(G, kb - g - G)), odd ? ring0 : ring1);
    chain<SUB16, MIN, FULL>(cur, slice + g * kBlockBytes, x[g], rows, acc);
    ahead.at(g);
    if (G == 2 && g + 1 < kb) {
      chain<SUB16, MIN, FULL>(cur + kC, slice + (g + 1) * kBlockBytes, x[g + 1], rows, acc);
      ahead.at(g + 1);
    }
  }
  for (int m = 0; m < 16; ++m) {
    if (!FULL && m >= rows) break;
    _mm512_mask_storeu_ps(y + m * ldy, valid, acc[m]);
  }
}

// Every M tile against one slice of the panel at weight row p0; the M
// tiles share the prefetch of the next slice.
template <bool SUB16, bool MIN>
void all_rows(const uint8_t* slice, int64_t kb0, int64_t kb, const XTile* xt, int64_t nb, int64_t n, float* y,
              int64_t ldy, int64_t p0, __mmask16 valid, int32_t* cbuf, Ahead next) {
  const int64_t mt = (n + 15) / 16;
  for (int64_t t = 0; t < mt; ++t) {
    const XTile* x = xt + t * nb;
    float* yt = y + 16 * t * ldy + p0;
    const int64_t l0 = t * next.lines / mt, l1 = (t + 1) * next.lines / mt;
    Ahead a{next.p + 64 * l0, l1 - l0};
    a.spread(kb);
    const int rows = int(std::min<int64_t>(16, n - 16 * t));
    if (mt == 1 && rows == 16) tile_rows<SUB16, MIN, true, 1>(slice, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
    else if (mt == 1) tile_rows<SUB16, MIN, false, 1>(slice, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
    else if (rows == 16) tile_rows<SUB16, MIN, true, 2>(slice, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
    else tile_rows<SUB16, MIN, false, 2>(slice, kb0, kb, x, rows, yt, ldy, valid, cbuf, a);
  }
}

// Blocks [kb0, kb0 + kb) of one packed panel into the scratch block layout
// with signed levels (Panel16 holds u = q + off).
template <bool Q4>
void fill_q(const uint8_t* pan, int64_t kb0, int64_t kb, uint8_t* dst) {
  using P = Pk<Q4>;
  const __m512i off = _mm512_set1_epi8(Q4 ? 8 : char(0x80));
  for (int64_t bb = 0; bb < kb; ++bb) {
    const uint8_t* l = P::lev(pan, kb0 + bb);
    uint8_t* o = dst + bb * kBlockBytes;
    for (int k = 0; k < 8; ++k) {
      const __m512i u = P::vec(l, k);
      _mm512_store_si512(o + 64 * k, Q4 ? _mm512_sub_epi8(u, off) : _mm512_xor_si512(u, off));
    }
    _mm512_store_ps(reinterpret_cast<float*>(o + 512), P::scale(pan, kb0 + bb));
  }
}

// K-quants (U = PkK: levels 0..15, already signed; PkQ6K: u = q + 32).
template <class U>
void fill_k(const uint8_t* pan, int64_t kb0, int64_t kb, uint8_t* dst) {
  const __m512i off = _mm512_set1_epi8(U::kSub16 ? 32 : 0);
  for (int64_t bb = 0; bb < kb; bb += 8)
    U::unit(pan + (kb0 + bb) / 8 * U::UB, [&](int j, const __m512i* W, __m512 ws0, __m512 ws1, __m512 wm) {
      uint8_t* o = dst + (bb + j) * kBlockBytes;
      for (int k = 0; k < 8; ++k) _mm512_store_si512(o + 64 * k, U::kSub16 ? _mm512_sub_epi8(W[k], off) : W[k]);
      _mm512_store_ps(reinterpret_cast<float*>(o + 512), ws0);
      _mm512_store_ps(reinterpret_cast<float*>(o + 576), ws1);
      _mm512_store_ps(reinterpret_cast<float*>(o + 640), wm);
    });
}

// Activation rows in chunks whose XTiles stay in L2 while every panel of
// the task runs against them: each panel reads all of a chunk's XTiles, so
// a long prompt's would otherwise stream from L3 or DRAM panel after panel.
constexpr int64_t kChunkBytes = 1 << 19;

// One panel at a time, K slice by K slice: fill the slice, then every
// activation row of the chunk against it. The next slice (of this panel or
// the next; panels are contiguous) is requested while this one's tiles run.
template <bool SUB16, bool MIN, class Fill>
void gemm_amx(const WeightView& w, int64_t pbytes, int64_t r0, int64_t r1, const XTile* xt, int64_t n,
              float* y, int64_t ldy, Scratch scratch, Fill fill) {
  const int64_t nb = w.cols / kQBlock;
  const int64_t chunk = 16 * std::max<int64_t>(4, kChunkBytes / (nb * int64_t(sizeof(XTile))));  // rows
  if (n > chunk) {
    for (int64_t i0 = 0; i0 < n; i0 += chunk)
      gemm_amx<SUB16, MIN>(w, pbytes, r0, r1, xt + i0 / 16 * nb, std::min(chunk, n - i0), y + i0 * ldy, ldy, scratch, fill);
    return;
  }
  uint8_t* slice = scratch.buf;                                           // [KB][704 B]
  int32_t* cbuf = reinterpret_cast<int32_t*>(scratch.buf + KB * kBlockBytes);  // [2 groups][2][kCInts] int32
  TileScope tiles(SUB16);
  const uint8_t* end = w.packed + ((r1 + L - 1) / L) * pbytes;
  for (int64_t p0 = r0; p0 < r1; p0 += L) {
    const uint8_t* pan = w.packed + (p0 / L) * pbytes;
    const __mmask16 valid = lanes(r1 - p0);
    for (int64_t kb0 = 0; kb0 < nb; kb0 += KB) {
      const int64_t kb = std::min<int64_t>(KB, nb - kb0);  // KB, kb0: whole K-quant super-blocks
      fill(pan, kb0, kb, slice);
      const uint8_t* from = pan + (kb0 + kb) * pbytes / nb;
      const uint8_t* to = std::min(end, from + KB * pbytes / nb);
      all_rows<SUB16, MIN>(slice, kb0, kb, xt, nb, n, y, ldy, p0, valid, cbuf, Ahead{from, std::max<int64_t>(0, (to - from) / 64)});
    }
  }
}

// Rows 16t .. 16t+15 of xq ([n, nb]) for t in [t0, t1) as XTiles, rows past n zero.
void tile_x_amx(const XBlock* xq, int64_t n, int64_t nb, int64_t t0, int64_t t1, XTile* out) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      XTile& o = out[t * nb + b];
      for (int m = 0; m < 16; ++m) {
        const int64_t i = 16 * t + m;
        const __m256i q = i < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i * nb + b].q))
                                : _mm256_setzero_si256();
        _mm256_store_si256(reinterpret_cast<__m256i*>(o.q[m]), q);
        o.d[m] = i < n ? xq[i * nb + b].d : 0.0f;
        o.s[m] = i < n ? xq[i * nb + b].s : 0.0f;
      }
    }
}

void quant_rows_amx(const WeightView& w, int64_t r0, int64_t r1, const XTile* xt, int64_t n, float* y,
                    int64_t ldy, Scratch s) {
  const int64_t nb = w.cols / kQBlock;
  switch (w.type) {  // the driver sends amx_tiles_apply() weights only
    case GgmlType::Q8_0:
      return gemm_amx<false, false>(w, (nb + 1) / 2 * Pk<false>::UB, r0, r1, xt, n, y, ldy, s, fill_q<false>);
    case GgmlType::Q4_0:
      return gemm_amx<false, false>(w, (nb + 1) / 2 * Pk<true>::UB, r0, r1, xt, n, y, ldy, s, fill_q<true>);
    case GgmlType::Q4_K:
      return gemm_amx<false, true>(w, nb / 8 * PkK::UB, r0, r1, xt, n, y, ldy, s, fill_k<PkK>);
    default:  // Q6_K
      return gemm_amx<true, false>(w, nb / 8 * PkQ6K::UB, r0, r1, xt, n, y, ldy, s, fill_k<PkQ6K>);
  }
}

}  // namespace

const IsaKernels& amx_kernels() {
  static const IsaKernels k = [] {
    IsaKernels a = avx512_kernels();  // the rest: the AVX-512 kernels
    a.tile_x = tile_x_amx;
    a.quant_rows_tiles = quant_rows_amx;
    return a;
  }();
  return k;
}

KVS_TARGET_END()

}  // namespace kvs::mm
