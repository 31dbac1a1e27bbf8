// AMX-BF16 tile kernels for float weights packed as PackLayout::AmxBf16
// (MatmulPrecision::Bf16, chosen at load; weight_pack.h has the layout).
//
// One tdpbf16ps multiplies 16 activation rows by 16 weight rows over 32
// columns and adds the products into a float32 C tile:
//   A [16, 32] bf16  activation rows 16t .. 16t+15, columns 32c .. 32c+31
//                    (bf16_x's rows, bf16_x_stride(cols) elements apart)
//   B [16, 32] bf16  chunk c of a weight panel: word 16j + r = columns
//                    32c + 2j, 32c + 2j + 1 of weight row r
//   C [16, 16] f32   C[m][r] += sum over the 32 columns of A[m] * W[r]
// C stays in its tile for the whole of K, chunk by chunk in increasing
// order, so an output's arithmetic depends only on its activation row and
// weight row: the same bits whatever n, whichever rows share its tile, and
// however the weight rows are split between threads (a C tile parked in
// scratch between K blocks comes back exactly). Up to 2 x 2 C tiles share
// each A and B load; bf16_rows_amx has the cache blocking.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/matmul_amx_tiles.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,amx-tile,amx-bf16")

namespace {

using amx_detail::TileMode;
using amx_detail::TileScope;

// Tile loads and stores. The asm names the memory it touches only loosely,
// so it clobbers memory: the loop keeps no values in registers across them.
#define KVS_BF_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(int64_t(stride)) : "memory")
#define KVS_BF_STORE(t, base, stride) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(int64_t(stride)) : "memory")

// C tile T (a literal in the asm) to and from memory, rows `stride` bytes apart.
template <int T>
inline __attribute__((always_inline)) void tile_store(void* p, int64_t stride) {
  if constexpr (T == 0) KVS_BF_STORE(0, p, stride);
  else if constexpr (T == 1) KVS_BF_STORE(1, p, stride);
  else if constexpr (T == 2) KVS_BF_STORE(2, p, stride);
  else KVS_BF_STORE(3, p, stride);
}
template <int T>
inline __attribute__((always_inline)) void tile_load(const void* p) {
  if constexpr (T == 0) KVS_BF_LOAD(0, p, 64);
  else if constexpr (T == 1) KVS_BF_LOAD(1, p, 64);
  else if constexpr (T == 2) KVS_BF_LOAD(2, p, 64);
  else KVS_BF_LOAD(3, p, 64);
}

// The C tiles of a block: tile 2 mi + ni for M tile mi and panel ni, held
// between K blocks in cs ([4][16, 16] floats; an exact round trip).
template <int MT, int NT>
inline __attribute__((always_inline)) void begin_c(bool first, const float* cs) {
  if (first) {
    _tile_zero(0);
    if (NT == 2) _tile_zero(1);
    if (MT == 2) _tile_zero(2);
    if (MT == 2 && NT == 2) _tile_zero(3);
    return;
  }
  tile_load<0>(cs);
  if (NT == 2) tile_load<1>(cs + 256);
  if (MT == 2) tile_load<2>(cs + 512);
  if (MT == 2 && NT == 2) tile_load<3>(cs + 768);
}
template <int MT, int NT>
inline __attribute__((always_inline)) void park_c(float* cs) {
  tile_store<0>(cs, 64);
  if (NT == 2) tile_store<1>(cs + 256, 64);
  if (MT == 2) tile_store<2>(cs + 512, 64);
  if (MT == 2 && NT == 2) tile_store<3>(cs + 768, 64);
}

// Lines of the next K block's B tiles (both panels: chunks at b and at
// b + pb) requested into L2 a few per chunk, so the block finds them there.
struct Ahead {
  const uint8_t* b = nullptr;
  int64_t pb = 0;
  int64_t line = 0, end = 0;  // next line to request, lines in all
  int64_t per = 0;            // lines per chunk
  inline __attribute__((always_inline)) void step() {
    for (const int64_t e = std::min(end, line + per); line < e; ++line)
      _mm_prefetch(reinterpret_cast<const char*>(b + (line & 1) * pb + 64 * (line >> 1)), _MM_HINT_T1);
  }
};

// MT M tiles x NT panels over kc chunks, into the C tiles: a, the first
// activation row at the first chunk (stride as bytes); b, the first
// panel's first chunk (the second panel's at b + pb).
template <int MT, int NT>
inline __attribute__((always_inline)) void products(const uint16_t* a, int64_t astride, const uint8_t* b,
                                                    int64_t pb, int64_t kc, Ahead& ahead) {
  for (int64_t c = 0; c < kc; ++c) {
    ahead.step();
    const uint16_t* ac = a + 32 * c;  // [16, 32] bf16 of M tile 0 ([16, 32] of tile 1 16 rows on)
    const uint8_t* bc = b + 1024 * c;
    KVS_BF_LOAD(4, ac, astride);
    KVS_BF_LOAD(6, bc, 64);
    if (NT == 2) KVS_BF_LOAD(7, bc + pb, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (NT == 2) _tile_dpbf16ps(1, 4, 7);
    if (MT == 2) {
      KVS_BF_LOAD(5, reinterpret_cast<const uint8_t*>(ac) + 16 * astride, astride);
      _tile_dpbf16ps(2, 5, 6);
      if (NT == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
}

// C tile T to y ([rows, cols] of it real, of [tile_rows, 16]): straight
// to y when whole, else through buf.
template <int T>
inline __attribute__((always_inline)) void store_c(float* y, int64_t ldy, int64_t rows, int64_t cols, int64_t tile_rows,
                                                   float* buf) {
  if (rows == tile_rows && cols == 16) {
    tile_store<T>(y, ldy * 4);
    return;
  }
  tile_store<T>(buf, 64);
  for (int64_t m = 0; m < rows; ++m) std::memcpy(y + m * ldy, buf + 16 * m, size_t(cols) * 4);
}

// Where one block (MT M tiles x NT panels) runs chunks [c0, c0 + kc) of K.
struct Block {
  const uint16_t* a;  // activations: its first row, chunk 0
  int64_t kp;         // activation row length (elements)
  const uint8_t* b;   // its first panel, chunk 0
  int64_t pb;         // bytes per panel
  int64_t rows, cols;  // real activation rows and weight rows of the block
  int64_t tr;          // rows of its C tiles
  float* y;
  int64_t ldy;
  float* cs;  // [4][256] its C tiles between K blocks
};

template <int MT, int NT>
void block(const Block& k, int64_t c0, int64_t kc, bool last, float* buf, Ahead& ahead) {
  begin_c<MT, NT>(c0 == 0, k.cs);
  products<MT, NT>(k.a + 32 * c0, k.kp * 2, k.b + 1024 * c0, k.pb, kc, ahead);
  if (!last) return park_c<MT, NT>(k.cs);
  const int64_t r0 = std::min<int64_t>(k.rows, 16), cl0 = std::min<int64_t>(k.cols, 16);
  store_c<0>(k.y, k.ldy, r0, cl0, k.tr, buf);
  if (NT == 2) store_c<1>(k.y + 16, k.ldy, r0, k.cols - 16, k.tr, buf);
  if (MT == 2) store_c<2>(k.y + 16 * k.ldy, k.ldy, k.rows - 16, cl0, k.tr, buf);
  if (MT == 2 && NT == 2) store_c<3>(k.y + 16 * k.ldy + 16, k.ldy, k.rows - 16, k.cols - 16, k.tr, buf);
}

void run_block(const Block& k, int64_t c0, int64_t kc, bool last, float* buf, Ahead& ahead) {
  if (k.rows > 16 && k.cols > 16) block<2, 2>(k, c0, kc, last, buf, ahead);
  else if (k.rows > 16) block<2, 1>(k, c0, kc, last, buf, ahead);
  else if (k.cols > 16) block<1, 2>(k, c0, kc, last, buf, ahead);
  else block<1, 1>(k, c0, kc, last, buf, ahead);
}

// Chunks per K block: two panels' B tiles of a K block (16 KiB) stay in L1
// while every M tile of the pass runs against them (docs/PERFORMANCE.md).
constexpr int64_t kKc = 8;
// Bytes of bf16 activations (a pass's rows over a span of K) kept in L2
// across the panels.
constexpr int64_t kPassBytes = 1 << 20;
// Fewest activation rows per pass: each pass streams the task's weights
// again, so a long K is split into spans rather than the pass shrunk.
constexpr int64_t kMinPass = 256;

// How a task's rows are walked: passes of `pass` activation rows, K in
// spans of `span` chunks, and panel pairs in groups of `group` whose C
// tiles all wait in scratch from one span to the next.
struct Walk {
  int64_t pass, span, group;
};

Walk plan_walk(int64_t n, int64_t nc, int64_t kp, size_t scratch_bytes) {
  const int64_t whole = 32 * std::max<int64_t>(2, kPassBytes / (64 * kp));  // rows over all of K
  Walk w{std::min(n, std::max(whole, kMinPass)), nc, 1 << 30};  // group: every pair (one span)
  if (whole < kMinPass) w.span = std::min(nc, std::max(kKc, kPassBytes / (64 * w.pass) / kKc * kKc));
  const int64_t tile_sets = int64_t(scratch_bytes / 4096);  // [4][16, 16] floats each
  w.pass = std::min(w.pass, 32 * tile_sets);
  if (w.span < nc) w.group = std::max<int64_t>(1, tile_sets / ((w.pass + 31) / 32));
  return w;
}

// Weight rows [g0, g1) of a task (one group of panel pairs) against every
// activation row, pass by pass and span by span.
void walk_group(const WeightView& w, const Walk& wk, int64_t g0, int64_t g1, const uint16_t* xb, int64_t n,
                float* y, int64_t ldy, float* cs, float* buf) {
  const int64_t kp = bf16_x_stride(w.cols), nc = bf16_chunks(w.cols), pb = nc * 1024;
  const int64_t tr = std::min<int64_t>(n, 16);
  const uint8_t* first = w.packed + (g0 / 16) * pb;
  for (int64_t m0 = 0; m0 < n; m0 += wk.pass) {
    const int64_t m1 = std::min(n, m0 + wk.pass), mblocks = (m1 - m0 + 31) / 32;
    for (int64_t s0 = 0; s0 < nc; s0 += wk.span) {
      const int64_t s1 = std::min(nc, s0 + wk.span);
      for (int64_t p0 = g0; p0 < g1; p0 += 32) {
        const uint8_t* b = w.packed + (p0 / 16) * pb;
        // C tiles of each M block: one set per panel pair where spans
        // follow each other, else one set reused by every pair.
        float* pcs = cs + (wk.span < nc ? (p0 - g0) / 32 * mblocks * 1024 : 0);
        for (int64_t c0 = s0; c0 < s1; c0 += kKc) {
          const int64_t kc = std::min(kKc, s1 - c0);
          // The next K block's B (the next panel pair's, or the next span's
          // first), spread over this block's chunks, so it is in L2 when
          // its block starts. Under 16 rows a block is too short for that:
          // the hardware's own stream does better (docs/PERFORMANCE.md).
          const uint8_t* next = nullptr;
          int64_t nkc = 0;
          if (c0 + kKc < s1) next = b + 1024 * (c0 + kKc), nkc = std::min(kKc, s1 - c0 - kKc);
          else if (p0 + 32 < g1) next = b + 2 * pb + 1024 * s0, nkc = std::min(kKc, s1 - s0);
          else if (s1 < nc) next = first + 1024 * s1, nkc = std::min(kKc, nc - s1);
          if (tr < 16) nkc = 0;
          Ahead ahead{next, pb, 0, 32 * nkc, (32 * nkc + mblocks * kc - 1) / (mblocks * kc)};
          for (int64_t i0 = m0; i0 < m1; i0 += 32) {
            const Block k{xb + i0 * kp, kp, b, pb, std::min<int64_t>(32, n - i0), std::min<int64_t>(32, g1 - p0),
                          tr, y + i0 * ldy + p0, ldy, pcs + (i0 - m0) / 32 * 1024};
            run_block(k, c0, kc, c0 + kc >= nc, buf, ahead);
          }
        }
      }
    }
  }
}

}  // namespace

void row_to_bf16_avx512(GgmlType t, const uint8_t* row, int64_t cols, int64_t kp, uint16_t* out) {
  for (int64_t k = 0; k < kp; k += 16) {
    const int64_t left = std::max<int64_t>(0, std::min<int64_t>(16, cols - k));
    const __mmask16 m = __mmask16((1u << left) - 1);
    if (t == GgmlType::BF16) {
      const __m256i v = _mm256_maskz_loadu_epi16(m, row + 2 * k);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), v);
      continue;
    }
    const __m512 v = t == GgmlType::F32 ? _mm512_maskz_loadu_ps(m, row + 4 * k)
                                        : _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
}

void bf16_x_amx(const float* x, int64_t ldx, int64_t cols, int64_t i0, int64_t i1, int64_t kp, uint16_t* out) {
  for (int64_t i = i0; i < i1; ++i)
    row_to_bf16_avx512(GgmlType::F32, reinterpret_cast<const uint8_t*>(x + i * ldx), cols, kp, out + i * kp);
}

void bf16_rows_amx(const WeightView& w, int64_t r0, int64_t r1, const uint16_t* xb, int64_t n, float* y,
                   int64_t ldy, Scratch scratch) {
  alignas(64) float buf[256];  // [16, 16]: a partial C tile on its way to y
  const Walk wk = plan_walk(n, bf16_chunks(w.cols), bf16_x_stride(w.cols), scratch.bytes);
  float* cs = reinterpret_cast<float*>(scratch.buf);  // [group][pass / 32][4][256]
  // Fewer than 16 rows (decode, small batches): tiles of n rows, so the
  // products and activation loads cover no padding.
  TileScope tiles(TileMode::Bf16, int(std::min<int64_t>(n, 16)));
  for (int64_t g0 = r0; g0 < r1; g0 += 32 * wk.group)
    walk_group(w, wk, g0, std::min(r1, g0 + 32 * wk.group), xb, n, y, ldy, cs, buf);
}

#undef KVS_BF_LOAD
#undef KVS_BF_STORE

KVS_TARGET_END()

}  // namespace kvs::mm
