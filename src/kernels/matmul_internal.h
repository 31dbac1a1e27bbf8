// Internal interface between the matmul driver (matmul.cpp) and the per-ISA
// kernels (matmul_scalar.cpp, matmul_avx2*.cpp, matmul_avx512*.cpp, matmul_amx.cpp).
//
// The arithmetic is defined once here and every path reproduces it exactly,
// so results are bit-identical across n, batch composition AND ISA paths:
//
// Quantized weights (all block types): each activation row is quantized per
// 32 elements (XBlock). A weight row is viewed as 32-element blocks with
// integer levels q[32], float scale(s) ws and optional float min wm, i.e.
// value = ws * q + wm (Q6_K: two scales, one per 16-element half). For each
// (weight row, activation row) the float accumulator runs, block by block in
// order, starting from +0:
//     acc = fma(float(isum), ws * xd, acc)          (isum = exact int dot)
//     acc = fma(wm, xs, acc)                        (only formats with a min)
// Integer sums are exact, so SIMD kernels may compute isum in any order;
// only this float chain is fixed, and it is per output element, so a lane =
// one weight row.
// The K-quants (Q4_K, Q5_K, Q6_K) instead run llama.cpp's K-quant x Q8_K
// arithmetic: their activations take one scale per 256-element super-block
// (the xd of its 8 XBlocks is the same), and each super-block adds one
// step. Q6_K:
//     S = sum over its 16 halves h of sc_h * isum_h   (exact int32)
//     acc = fma(float(S), d * xd, acc)
// with sc_h the int8 sub-scales and d the super-block scale. Q4_K / Q5_K
// (value = d * sc_j * q - dmin * m_j in block j, q >= 0):
//     S = sum over its 8 blocks j of sc_j * isum_j    (exact int32)
//     M = sum over its 8 blocks j of m_j * xsum_j     (exact int32)
//     acc = fma(float(S), d * xd, acc)
//     acc = fma(float(M), (-dmin) * xd, acc)
// with xsum_j the block's activation level sum (XBlock::corr[1]). The
// integer sums let the AMX tiles fold the sub-scales into the weights
// (sc * q split into two bytes), so the float chain runs once per 256
// elements.
// MXFP4 fits it unchanged: q = the doubled e2m1 value (-12..12), ws =
// 2^(e - 128), so ws * q is the element exactly. The peers' dots differ
// only in the activations: they round xd to 16 bits (llama.cpp's Q8_0 to
// fp16, ik_llama.cpp's Q8_2 to bf16), kvserve keeps it f32 (the XBlock
// below), for every weight format alike.
//
// Float weights (F32, F16, BF16): 16 partial sums, lane j accumulating the
// k = j (mod 16) products with fma in increasing k, then the fixed tree
// (j, j+8) -> (j, j+4) -> (j, j+2) -> (0, 1). See float_tree_sum().
//
// Float weights with a packed copy (w.pack == Panel16 with AVX-512 at load,
// Panel8 with AVX2): the "k-chain" order instead, one fma chain per output over k in increasing
// order from +0. It suits the outer-product kernels that layout feeds (16
// rows per vector, x[k] broadcast); the order belongs to the view, so every
// ISA path given a packed float view runs it (float_rows_chain_scalar).
//
// Float weights with an AmxBf16 copy (MatmulPrecision::Bf16 only): the AMX-BF16
// tile unit's sum of bfloat16 products, kept in the tile over k in order
// (matmul_amx_bf16.cpp); only the AMX path runs it.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/quant.h"

namespace kvs::mm {

constexpr int kQBlock = 32;  // activation / weight sub-block size for all quantized types
constexpr int kSuperBlocks = 8;  // blocks per K-quant super-block (256 elements)

// One 32-element block of a quantized activation row. A call holds
// [n, cols / 32] of these.
struct XBlock {
  int8_t q[32];     // round(x / xd), in [-127, 127]
  float d;          // xd = amax / 127 (0 for an all-zero block)
  float s;          // xs = xd * sum(q): pairs with a weight min term
  int32_t corr[2];  // -off * sum(q): [0] whole block, or [0]/[1] = halves for sub16 formats;
                    // Q4_K / Q5_K (super, not sub16): [1] = sum(q), the block's xsum
};
static_assert(sizeof(XBlock) == 48);

// The same activations for the AMX tile kernels: rows 16t .. 16t+15 of one
// 32-element block, as one A tile (levels row by row) and the per-row
// values as arrays, so a kernel reads each with fixed offsets. A call holds
// [ceil(n / 16), cols / 32] of these; rows past n are zero.
struct XTile {
  int8_t q[16][32];  // XBlock::q of the 16 rows
  float d[16];       // XBlock::d
  float s[16];       // XBlock::s (formats with a min; zero for the others)
};
static_assert(sizeof(XTile) == 640);

// K-quant activations for the AMX tiles: rows 16t .. 16t+15 of one
// 256-element super-block as the A tiles [16, 64] of its four K = 64
// products (row stride 256), the rows' scale (the super-block's xd) and,
// for Q4_K, the blocks' level sums as int16 pairs (xsum_2p, xsum_2p+1) per
// dword, which the chain multiplies with the mins (vpdpwssd). Kept where
// the super-block's 8 XTiles would be; rows past n are zero.
struct alignas(64) XSuper {
  int8_t q[16][256];
  float d[16];
  int16_t xs[16][8];
  uint8_t pad[8 * 640 - 16 * 256 - 64 - 256];  // the 8 XTiles' footprint, so XSuper arrays index alike
};
static_assert(sizeof(XSuper) == 8 * sizeof(XTile));

// How a weight format maps onto the int8 dot product. SIMD kernels feed
// weights as unsigned bytes u = q + off (vpdpbusd / maddubs take u8 x s8),
// and the activation side carries the -off * sum(x) correction.
struct QFormat {
  int off;             // level offset: u = q + off is in [0, 255]
  bool sub16;          // Q6_K: int8 scales per 16-element half
  bool has_min;        // value = ws * q + wm with wm != 0 (Q4_1, Q5_1, Q4_K, Q5_K)
  bool super = false;  // K-quants: activations scaled per 256, one float step per super-block (above)
};
// Whether two formats take the same quantized activations.
inline bool same_activations(QFormat a, QFormat b) {
  return a.off == b.off && a.sub16 == b.sub16 && a.super == b.super;
}
// `signed_q8`: Q8_0 kept as signed bytes (AVX2 uses the sign trick instead of an offset).
QFormat qformat(GgmlType t, bool signed_q8 = false);
bool is_float_type(GgmlType t);
bool is_quant_type(GgmlType t);  // supported by the quantized-activation kernels

// MXFP4's unsigned levels u = kMxfp4Values[code] + 12, indexed by code: the
// table the SIMD unpackers look codes up in (vpshufb), 16 bytes.
struct Mxfp4Levels {
  alignas(16) uint8_t u[16];
};
inline constexpr Mxfp4Levels kMxfp4Levels = [] {
  Mxfp4Levels t{};
  for (int c = 0; c < 16; ++c) t.u[c] = uint8_t(kMxfp4Values[c] + 12);
  return t;
}();

// One weight block unpacked to levels (scalar reference for all formats).
struct WBlock {
  int8_t q[32];  // signed levels, value = ws[0] * q[e] + wm (K-quants: below)
  float ws[2];
  float wm;
  // Q6_K: the halves' int8 scales, value = ws[0] * sc[e / 16] * q[e] (ws[0] = d).
  // Q4_K / Q5_K: {sc_j, m_j}, value = ws[0] * sc_j * q[e] + wm * m_j (ws[0] = d, wm = -dmin).
  int32_t sc[2];
};
// Block b (32 elements) of a weight row in format t.
void unpack_block(GgmlType t, const uint8_t* row, int64_t b, WBlock* out);

// Rounds to nearest-even for |v| < 2^22, like cvtps2dq under the default MXCSR.
inline float round_rne(float v) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return (v + magic) - magic;
}

// The fixed final reduction of the 16 float partial sums.
inline float float_tree_sum(const float* p) {  // p: [16]
  float a[8];
  for (int j = 0; j < 8; ++j) a[j] = p[j] + p[j + 8];
  for (int j = 0; j < 4; ++j) a[j] = a[j] + a[j + 4];
  for (int j = 0; j < 2; ++j) a[j] = a[j] + a[j + 2];
  return a[0] + a[1];
}

// Per-thread scratch for GEMM panels (owned by the driver, 64-B aligned).
struct Scratch {
  uint8_t* buf = nullptr;
  size_t bytes = 0;
};
constexpr size_t kScratchBytes = 512 * 1024;

// What one ISA provides. Row ranges [r0, r1) are a task's share of W; the
// kernels write y[i * ldy + r] for i in [0, n), r in [r0, r1).
struct IsaKernels {
  int row_align;  // preferred multiple for task row chunks (panel height)
  // Quantize one activation row (cols % 32 == 0) into cols / 32 XBlocks.
  void (*quantize_x)(const float* x, int64_t cols, QFormat f, XBlock* out);
  bool signed_q8;  // which qformat() convention the quant kernels expect
  void (*quant_rows)(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
                     float* y, int64_t ldy, Scratch scratch);
  void (*float_rows)(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                     int64_t n, float* y, int64_t ldy, Scratch scratch);
  // Tile kernels (nullptr where the ISA has none): the driver calls them
  // instead of quant_rows when amx_tiles_apply(w, n), with the activations
  // also laid out as XTiles by tile_x (M tiles [t0, t1), all blocks; s
  // when the format has a min, else zero; Q6_K: XSuper per super-block).
  void (*tile_x)(const XBlock* xq, int64_t n, int64_t nb, int64_t t0, int64_t t1, QFormat f,
                 XTile* out) = nullptr;
  void (*quant_rows_tiles)(const WeightView& w, int64_t r0, int64_t r1, const XTile* xt, int64_t n, float* y,
                           int64_t ldy, Scratch scratch) = nullptr;
  // AMX-BF16 (nullptr where the ISA has none): the driver runs every
  // PackLayout::AmxBf16 matrix with these. bf16_x writes activation rows
  // [i0, i1) of x as bfloat16 rows of kp = bf16_x_stride(cols) elements
  // (the tail zero); bf16_rows takes those rows, ceil(n / 16) * 16 of
  // them (rows past n zero), for weight rows [r0, r1), r0 % 16 == 0.
  void (*bf16_x)(const float* x, int64_t ldx, int64_t cols, int64_t i0, int64_t i1, int64_t kp,
                 uint16_t* out) = nullptr;
  void (*bf16_rows)(const WeightView& w, int64_t r0, int64_t r1, const uint16_t* xb, int64_t n, float* y,
                    int64_t ldy, Scratch scratch) = nullptr;
};
const IsaKernels& scalar_kernels();
const IsaKernels& avx2_kernels();
const IsaKernels& avx512_kernels();
// Isa::Amx: avx512_kernels() except quantized Panel16 weights at n >=
// amx_min_rows(type), which run AMX-INT8 tiles (matmul_amx.cpp).
const IsaKernels& amx_kernels();
// Row length (elements) of the bf16 activations for `cols` columns: whole
// 32-column chunks plus one cache line, so that the 16 rows an A tile
// loads do not all fall in one L1 set (a multiple of 4 KiB would).
inline int64_t bf16_chunks(int64_t cols) { return (cols + 31) / 32; }  // 32-column chunks (AmxBf16)
inline int64_t bf16_x_stride(int64_t cols) { return bf16_chunks(cols) * 32 + 32; }
// The AMX-BF16 kernels (matmul_amx_bf16.cpp), which amx_kernels() carries.
void bf16_x_amx(const float* x, int64_t ldx, int64_t cols, int64_t i0, int64_t i1, int64_t kp, uint16_t* out);
void bf16_rows_amx(const WeightView& w, int64_t r0, int64_t r1, const uint16_t* xb, int64_t n, float* y,
                   int64_t ldy, Scratch scratch);
// Q6_K, Q4_K and Q5_K on the AMX-INT8 tiles (matmul_amx_super.cpp): their
// activations as XSuper (tile_x's layout for the format; `sums`: with the
// blocks' level sums, for Q4_K / Q5_K), and weight rows [r0, r1) of a Panel16 copy
// (r0 % 16 == 0; `end`: where prefetching stops), over super-blocks
// [sb0, sb1) of K (y accumulates across calls; sb0 = 0 starts it; few
// rows take the whole K in one call).
void tile_x_super(const XBlock* xq, int64_t n, int64_t nb, int64_t t0, int64_t t1, bool sums, XTile* out);
void panels_rows_super(const WeightView& w, int64_t r0, int64_t r1, const uint8_t* end, const XTile* xt, int64_t n,
                       float* y, int64_t ldy, Scratch scratch, int64_t sb0, int64_t sb1);
// Q4_K / Q5_K for few M tiles (n <= kKQuantFewRows; matmul_amx_q4k_rows.cpp): the
// same bits from raw levels and per-block products, without folding the
// scales.
constexpr int64_t kKQuantFewRows = 16;
void panels_rows_kquant_few(const WeightView& w, int64_t r0, int64_t r1, const uint8_t* end, const XTile* xt,
                            int64_t n, float* y, int64_t ldy, Scratch scratch);
// A float weight row (F32 / F16 / BF16, `cols` elements) as kp bfloat16
// values, rounded to nearest even by vcvtneps2bf16, the tail zero: the
// AmxBf16 packing's conversion (needs AVX512-BF16).
void row_to_bf16_avx512(GgmlType t, const uint8_t* row, int64_t cols, int64_t kp, uint16_t* out);

// Float-weight kernels, one file per ISA (matmul_avx2_float.cpp, matmul_avx512_float.cpp).
void float_rows_avx2(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                     int64_t n, float* y, int64_t ldy, Scratch scratch);
void float_rows_avx512(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                       int64_t n, float* y, int64_t ldy, Scratch scratch);

// AVX-512 kernels for float weights with a Panel16 copy (k-chain order;
// matmul_avx512_float_packed.cpp). r0 % 16 == 0.
void float_rows_avx512_packed(const WeightView& w, int64_t r0, int64_t r1, const float* x,
                              int64_t ldx, int64_t n, float* y, int64_t ldy, Scratch scratch);
// AVX2 kernels for float weights with a Panel8 copy (k-chain order;
// matmul_avx2_float_packed.cpp). r0 % 8 == 0.
void float_rows_avx2_packed(const WeightView& w, int64_t r0, int64_t r1, const float* x,
                            int64_t ldx, int64_t n, float* y, int64_t ldy, Scratch scratch);
// The k-chain order from the file layout, plainly (the scalar path, and an
// ISA path given the other ISA's packed float view; the tests' reference).
void float_rows_chain_scalar(const WeightView& w, int64_t r0, int64_t r1, const float* x,
                             int64_t ldx, int64_t n, float* y, int64_t ldy);

// AVX-512 kernels for PackLayout::Panel16 weights (matmul_avx512_packed.cpp);
// reached from avx512_kernels().quant_rows when w.pack says so. r0 % 16 == 0.
void quant_rows_avx512_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq,
                              int64_t n, float* y, int64_t ldy);

// AVX2 kernels for PackLayout::Panel8 weights (matmul_avx2_packed.cpp);
// reached from avx2_kernels().quant_rows when w.pack says so. r0 % 8 == 0.
void quant_rows_avx2_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
                            float* y, int64_t ldy, Scratch scratch);

// Scalar activation quantizer (the definition the SIMD ones must match).
void quantize_x_scalar(const float* x, int64_t cols, QFormat f, XBlock* out);

}  // namespace kvs::mm
