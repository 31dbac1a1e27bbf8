// Weight-matrix products: Y[n, rows] = X[n, cols] · W[rows, cols]^T.
// W is stored row-major in its file type (one row = `cols` elements,
// row_bytes(type, cols) bytes). n = 1 is decode (matrix-vector, memory
// bound); n > 1 is prefill / batched decode (compute bound).
//
// Determinism contract: Y[i, r] is computed with the same arithmetic in the
// same order whatever n is and whichever other rows are in X, so a token's
// logits never depend on batch composition (see docs/ARCHITECTURE.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include "kernels/quant.h"

namespace kvs {

class ThreadPool;

// How `WeightView::packed` is laid out (kernels/weight_pack.h): 16-row
// panels for the AVX-512 kernels, 8-row panels for the AVX2 ones; AmxBf16
// holds float weights as bfloat16 tiles for the AMX-BF16 kernels, chosen
// at load by MatmulPrecision::Bf16 only.
enum class PackLayout : uint8_t { None = 0, Panel16 = 1, Panel8 = 2, AmxBf16 = 3 };

// The arithmetic of products with float (F32 / F16 / BF16) weights.
//   Fp32: float32 throughout, in the fixed orders of matmul_internal.h (the
//         default; the same bits on every machine).
//   Bf16: weights rounded to bfloat16 at load, activations rounded to
//         bfloat16 per call, products summed in float32 inside AMX-BF16
//         tiles, for every n (so output still does not depend on batching
//         or chunking). Needs AMX-BF16; the bits are those of the tile unit.
// Quantized weights are not affected: their kernels are exact either way.
enum class MatmulPrecision : uint8_t { Fp32 = 0, Bf16 = 1 };
std::string precision_name(MatmulPrecision p);
// "fp32" / "bf16"; throws std::invalid_argument naming the choices otherwise.
MatmulPrecision parse_precision(const std::string& s);

struct WeightView {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features
  size_t row_stride = 0;  // bytes between rows
  // Optional load-time copy in a kernel-friendly layout. `data` stays valid
  // (paths that cannot read `packed` use it); both hold the same values.
  const uint8_t* packed = nullptr;
  PackLayout pack = PackLayout::None;
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_stride; }
};

// A row stride for an output n wide: one cache line past whole lines, so
// the rows of an M tile (which the tile kernels load and store between K
// slices) fall in different cache sets; a multiple of 4 KiB put all of
// them in one L1 set and few L2 sets.
inline int64_t padded_ld(int64_t n) { return (n + 15) / 16 * 16 + 16; }

// Y: [n, w.rows] row-major with leading dimension ldy; X: [n, w.cols] with ldx.
void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
            ThreadPool& pool);

// The activation of a gated FFN, g = act(g, u) element-wise (ops.h's
// swiglu_inplace / geglu_inplace).
enum class Glu : uint8_t { SwiGlu, GeGlu };
// Y = act(G, U) · W^T, an FFN's down projection with its gate's activation
// (G, U: [n, w.cols] at ldx). Bit-identical to act in place on G, then
// matmul(). Quantized weights quantize act(G, U) a piece at a time as they
// read G and U, so it is never written out, and G stays as it was; with
// float weights G holds act(G, U) afterwards.
void matmul_glu(const WeightView& w, float* g, const float* u, int64_t ldx, Glu act, int64_t n, float* y,
                int64_t ldy, ThreadPool& pool);
// Several products of the same X, one pool dispatch: Y_j = X · W_j^T for
// every output j (Q/K/V, gate/up). X is quantized once per weight format and
// the rows of all matrices are split into tasks together, so threads are not
// parked between the products. Each Y_j is bit-identical to matmul().
struct MatmulOut {
  const WeightView* w;
  float* y;
  int64_t ldy;
};
void matmul_multi(const MatmulOut* outs, int count, const float* x, int64_t ldx, int64_t n, ThreadPool& pool);

// Products of different X with different W, one pool dispatch: Y_g = X_g ·
// W_g^T for every group g (the experts of a mixture-of-experts layer, each
// over the token rows routed to it). Each X_g is quantized once per weight
// format (consecutive groups with the same X and format share it), and the
// rows of all matrices are split into tasks together. Each Y_g is
// bit-identical to matmul(W_g, X_g).
struct MatmulGroup {
  const WeightView* w;
  const float* x;  // [n, w->cols], leading dimension ldx
  int64_t ldx;
  int64_t n;
  float* y;        // [n, w->rows], leading dimension ldy
  int64_t ldy;
};
void matmul_grouped(const MatmulGroup* groups, int count, ThreadPool& pool);

// Scalar reference for tests: dequantize each row exactly, float32 dot.
void matmul_reference(const WeightView& w, const float* x, int64_t ldx, int64_t n, float* y,
                      int64_t ldy);

// Scalar reference of the quantized-activation algorithm the fast paths run
// (activations quantized per 32 elements, exact integer block dots, the fixed
// float accumulation order of matmul_internal.h). Every ISA path of matmul()
// is bit-identical to it. Single-threaded, ignores the ISA override.
void matmul_q8_reference(const WeightView& w, const float* x, int64_t ldx, int64_t n, float* y,
                         int64_t ldy);

// Vector operations per output and 32-element block in the float chain of
// the quantized-activation kernels, which their exactness fixes: convert,
// scale and FMA per block; one more FMA for a weight min (Q4_1, Q5_1, Q4_K,
// Q5_K); Q6_K's per super-block (a shift and an add join its two integer
// sums first), spread over its 8 blocks. 0 for float weights.
// It bounds the AMX tile kernels (docs/PERFORMANCE.md), so the bench's
// roofline counts it.
double chain_ops_per_block(GgmlType t);

// Row `r` of W as float (embedding lookup).
void dequantize_weight_row(const WeightView& w, int64_t r, float* out);

}  // namespace kvs
