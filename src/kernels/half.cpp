#include "kernels/half.h"

namespace kvs {

namespace {
uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

fp16_t f32_to_fp16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7FFFFFFF;
  if (a >= 0x7F800000u) {
    if (a == 0x7F800000u) return sign | 0x7C00;
    // NaN: keep the top payload bits, force quiet so it never turns into inf.
    return sign | 0x7E00 | static_cast<uint16_t>((a >> 13) & 0x3FF);
  }
  const int exp = static_cast<int>(a >> 23) - 127;
  if (exp > 15) return sign | 0x7C00;  // overflow
  if (exp >= -14) {
    // Normal half. Rounding carries into the exponent naturally (0x7BFF+1 = inf).
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | ((a >> 13) & 0x3FF);
    const uint32_t rem = a & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: +-0
  // Subnormal half: units of 2^-24. m carries the implicit bit (24 bits).
  const uint32_t m = (a & 0x7FFFFF) | 0x800000;
  const int shift = -(exp + 1);  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1))) ++h;  // may round up to the smallest normal
  return sign | static_cast<uint16_t>(h);
}

bf16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFF) > 0x7F800000u) return static_cast<bf16_t>((u >> 16) | 0x40);  // quiet NaN
  // Round to nearest even on the dropped 16 bits; subnormals round the same
  // way and overflow carries into inf.
  return static_cast<bf16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

}  // namespace kvs
