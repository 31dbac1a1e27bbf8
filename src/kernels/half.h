// IEEE half and bfloat16 <-> float, the one definition every kernel uses
// (weights, quantized block scales, the f16/bf16 KV cache). Decoding is exact
// and inline because the matmul and attention inner loops call it per element.
#pragma once
#include <cstdint>
#include <cstring>

namespace kvs {

using fp16_t = uint16_t;  // IEEE half, raw bits
using bf16_t = uint16_t;  // bfloat16, raw bits

inline float fp16_to_f32(fp16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  // inf / NaN keep the payload; normal numbers rebias the exponent 15 -> 127.
  const uint32_t bits = exp == 31 ? sign | 0x7F800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bf16_to_f32(bf16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

fp16_t f32_to_fp16(float f);  // round to nearest even
bf16_t f32_to_bf16(float f);  // round to nearest even

}  // namespace kvs
