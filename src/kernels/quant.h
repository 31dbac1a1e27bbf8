// Tensor element types and quantized block formats, bit-exact with ggml's
// definitions (ggml-common.h), so GGUF files from llama.cpp load unchanged.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/half.h"

namespace kvs {

// Values are the on-disk GGUF type ids.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
};

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK_K = 256;
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
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

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
// Q4_K, Q5_K, Q6_K. Throws for others.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace kvs
