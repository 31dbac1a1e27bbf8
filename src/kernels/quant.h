// Tensor element types and quantized block formats, bit-exact with ggml's
// definitions (ggml-common.h), so GGUF files from llama.cpp load unchanged.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/half.h"

namespace kvs {

// Values are the on-disk GGUF type ids.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
  MXFP4 = 39,  // the same id in llama.cpp and ik_llama.cpp
};

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK_MXFP4 = 32, QK_K = 256;
constexpr int K_SCALE_SIZE = 12;

#pragma pack(push, 1)
struct BlockQ4_0 { fp16_t d; uint8_t qs[QK4_0 / 2]; };                 // 18 B / 32
struct BlockQ4_1 { fp16_t d, m; uint8_t qs[QK4_1 / 2]; };              // 20 B / 32
struct BlockQ5_0 { fp16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };  // 22 B / 32
struct BlockQ5_1 { fp16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };  // 24 B / 32
struct BlockQ8_0 { fp16_t d; int8_t qs[QK8_0]; };                      // 34 B / 32
struct BlockQ4_K { fp16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };  // 144 B
struct BlockQ5_K { fp16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };  // 176 B
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; fp16_t d; };  // 210 B
struct BlockQ8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };  // activations for K-quants
// OCP microscaling FP4: one E8M0 exponent, then e2m1 codes as in Q4_0
// (element j in the low nibble of qs[j], j + 16 in the high one).
struct BlockMXFP4 { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; };            // 17 B / 32
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockMXFP4) == 17);

// MXFP4 element values: the e2m1 code's value doubled, so they are integers
// (ggml's kvalues_mxfp4); code 8 is -0. The value of code c in a block with
// exponent byte e is kMxfp4Values[c] * e8m0_half(e).
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Half of the E8M0 scale, 2^(e - 128), for every byte e (the halving undoes
// the doubled values). ggml's GGML_E8M0_TO_FP32_HALF: e = 0 and 1 give the
// subnormals 2^-128 and 2^-127, and 255 (NaN in the OCP format) gives 2^127.
inline float e8m0_half(uint8_t e) {
  const uint32_t u = e >= 2 ? uint32_t(e - 1) << 23 : 0x00200000u << e;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct TypeTraits {
  const char* name;
  int block_elems;     // elements per block (1 for F32/F16/BF16)
  size_t block_bytes;  // bytes per block
  bool supported;      // we can dequantize / multiply it
};

// Throws std::invalid_argument for ids that are not a known ggml type.
const TypeTraits& type_traits(GgmlType t);
bool is_known_type(uint32_t raw);
std::string type_name(GgmlType t);
// Bytes for n elements (n must be a multiple of block_elems; throws otherwise).
size_t row_bytes(GgmlType t, int64_t n);

// Scalar reference: n elements of `src` (type t) to float. Exact ggml math.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);
// Scalar reference quantizers (ggml's *_ref algorithms) used by the GGUF
// writer and tests. Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q5_K, Q6_K, MXFP4. Throws for others.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace kvs
